"""In-flight batching's scheduler: decodes first, prompt chunks in the budget left,
admission only with blocks, preemption of the sequence admitted last, prefix sharing."""

from __future__ import annotations

from shoal.workers.generative.block_pool import BlockPool
from shoal.workers.generative.scheduler import Plan, Scheduler, SchedulerConfig, Sequence


def _seq(i: int, length: int, base: int = 0) -> Sequence:
    return Sequence(i, [base + t for t in range(length)], length)


def _run(s: Scheduler, plan: Plan) -> None:
    """The model computed the plan; each sequence whose tokens are all in gets one more."""
    s.stepped(plan)
    for seq, _ in plan.items:
        if seq.computed == len(seq.tokens):
            seq.tokens.append(1000 + len(seq.tokens))


def test_a_long_prompt_is_chunked_while_running_sequences_decode() -> None:
    s = Scheduler(SchedulerConfig(block_size=4, max_step_tokens=8, prefill_chunk=8), BlockPool(64))
    a = _seq(0, 3)
    s.add(a)
    _run(s, s.schedule())  # a's prompt in one step
    long = _seq(1, 30, base=100)
    s.add(long)
    steps = []
    while long.computed < 30:
        plan = s.schedule()
        steps.append([(q.seq_id, n) for q, n in plan.items])
        _run(s, plan)
    # a decodes in every step; the long prompt takes the 7 tokens left of each budget
    assert all(step[0] == (0, 1) for step in steps)
    assert [n for step in steps for i, n in step if i == 1] == [7, 7, 7, 7, 2]


def test_admission_waits_for_blocks_and_running_sequences_are_capped() -> None:
    s = Scheduler(SchedulerConfig(block_size=4, max_running=2), BlockPool(4))
    for i in range(3):
        s.add(_seq(i, 6, base=10 * i))
    plan = s.schedule()
    assert [q.seq_id for q, _ in plan.items] == [0, 1]  # two blocks each: the pool is full
    assert len(s.waiting) == 1
    _run(s, plan)
    s.finish(s.running[0])
    assert s.pool.num_used == 2
    plan = s.schedule()
    assert [q.seq_id for q, _ in plan.items] == [1, 2]


def test_the_sequence_admitted_last_is_preempted_and_recomputed_with_its_outputs() -> None:
    s = Scheduler(SchedulerConfig(block_size=2, max_step_tokens=16), BlockPool(4))
    a, b = _seq(0, 3), _seq(1, 3, base=50)
    s.add(a)
    s.add(b)
    _run(s, s.schedule())  # 2 blocks each, both with their first output: 4 tokens in 2 blocks
    plan = s.schedule()  # a's 4th token fits; its 5th needs a third block: b goes
    _run(s, plan)
    plan = s.schedule()
    assert plan.preempted == [b] and s.preemptions == 1
    assert b.blocks == [] and b.computed == 0 and b.output_len == 2  # outputs kept
    assert list(s.waiting) == [b]
    _run(s, plan)
    s.finish(a)
    plan = s.schedule()  # b comes back: its prompt and its outputs are recomputed
    assert plan.items == [(b, 5)]
    assert s.pool.num_used == 3


def test_a_new_sequence_shares_the_computed_blocks_of_an_identical_prompt_prefix() -> None:
    s = Scheduler(SchedulerConfig(block_size=4), BlockPool(16))
    a = _seq(0, 10)
    s.add(a)
    _run(s, s.schedule())
    b = _seq(1, 10)  # the same prompt
    c = Sequence(2, [*range(8), 77, 78], 10)  # the same first two blocks
    s.add(b)
    s.add(c)
    plan = s.schedule()
    items = {q.seq_id: n for q, n in plan.items}
    assert items == {0: 1, 1: 2, 2: 2}  # each computes only what follows the shared blocks
    assert b.blocks[:2] == a.blocks[:2] == c.blocks[:2]
    assert s.pool.refs(a.blocks[0]) == 3
    for q in (a, b, c):
        s.finish(q)
    assert s.pool.num_used == 0


def test_a_sequence_writing_into_a_shared_block_gets_its_own_copy_first() -> None:
    s = Scheduler(SchedulerConfig(block_size=4), BlockPool(8))
    a = _seq(0, 4)
    s.add(a)
    s.running.append(s.waiting.popleft())
    a.blocks = s.pool.allocate(1) or []
    s.pool.register(a.blocks[0], a.hashes[0])
    other = s.pool.share(a.hashes)  # another holder of a's block
    a.computed = 3  # a rewrites its last slot (as a recompute would)
    plan = s.schedule()
    assert plan.copies == [(other[0], a.blocks[0])] and a.blocks[0] != other[0]
    assert s.pool.refs(other[0]) == 1


def test_decodes_come_before_prompt_chunks_of_sequences_admitted_earlier() -> None:
    s = Scheduler(
        SchedulerConfig(block_size=4, max_step_tokens=100, prefill_chunk=4), BlockPool(64)
    )
    a, b, c = _seq(0, 20), _seq(1, 20, base=100), _seq(2, 2, base=200)
    for q in (a, b, c):
        s.add(q)
    _run(s, s.schedule())  # all three admitted, in that order; c decodes from now on
    s.config = SchedulerConfig(block_size=4, max_step_tokens=8, prefill_chunk=4)
    plan = s.schedule()  # a and b's chunks alone would take the whole budget
    assert [(q.seq_id, n) for q, n in plan.items] == [(2, 1), (0, 4), (1, 3)]


def test_a_prompt_prefix_stays_cached_for_the_next_request_after_the_last_one_ended() -> None:
    s = Scheduler(SchedulerConfig(block_size=4), BlockPool(16))
    a = _seq(0, 10)
    s.add(a)
    _run(s, s.schedule())
    s.finish(a)
    assert s.pool.num_used == 0
    b = Sequence(1, [*range(8), 50, 51], 10)  # a's first two blocks, then its own
    s.add(b)
    plan = s.schedule()
    assert plan.items == [(b, 2)]  # only what follows the two cached blocks
    assert (s.prompt_tokens, s.prefix_hit_tokens) == (20, 8)
