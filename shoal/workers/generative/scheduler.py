"""In-flight batching's scheduler: which sequences run in the next model step, and how
many of their tokens (pure: no torch, no clock, no threads).

Each step has a token budget (``max_step_tokens``). The running sequences come first:
those decoding (one token each), then those whose prompt is not all computed yet (a chunk
of it each, at most ``prefill_chunk``), so that a long prompt is computed over several
steps while the others keep decoding. What budget is left admits
waiting sequences, oldest first, while fewer than ``max_running`` run and the pool has
the blocks for their first chunk (a new sequence first takes the registered blocks of
its prompt's prefix, held by running sequences or cached free: ``BlockPool.share``).

A running sequence that needs a block when none is free takes one by preemption: the
sequence admitted last gives back all its blocks and waits, first in line, to be
recomputed from its tokens (prompt and outputs so far); its outputs are kept, so its
client only sees a pause. A step that preempted admits nobody.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from shoal.workers.generative.block_pool import BlockPool, block_hashes


@dataclass(frozen=True)
class SchedulerConfig:
    block_size: int = 16
    max_running: int = 32
    max_step_tokens: int = 512
    prefill_chunk: int = 256


@dataclass(eq=False)
class Sequence:
    """A request's tokens (its prompt, then what it generated) and where their KV is."""

    seq_id: int
    tokens: list[int]
    prompt_len: int
    blocks: list[int] = field(default_factory=list)
    computed: int = 0  # tokens whose KV is in ``blocks``
    registered: int = 0  # full prompt blocks registered for sharing
    hashes: list[int] = field(default_factory=list)  # of the full prompt blocks
    preemptions: int = 0
    data: Any = None  # the engine's (sampling state, the client's request)

    @property
    def output_len(self) -> int:
        return len(self.tokens) - self.prompt_len


@dataclass
class Plan:
    """One step: each scheduled sequence with its count of new tokens, the block copies
    (source, destination) to make before the step, and the sequences preempted."""

    items: list[tuple[Sequence, int]] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)


class Scheduler:
    def __init__(self, config: SchedulerConfig, pool: BlockPool) -> None:
        self.config, self.pool = config, pool
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0
        self.prompt_tokens = 0  # of the sequences admitted (the first time)
        self.prefix_hit_tokens = 0  # of those, taken from shared or cached blocks

    def add(self, seq: Sequence) -> None:
        b = self.config.block_size
        seq.hashes = block_hashes(seq.tokens, b, seq.prompt_len // b)
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def schedule(self) -> Plan:
        plan = Plan()
        budget = self.config.max_step_tokens
        decoding = [s for s in self.running if len(s.tokens) - s.computed == 1]
        chunked = [s for s in self.running if len(s.tokens) - s.computed > 1]
        for seq in decoding + chunked:  # (decodes first: a prompt chunk never stalls them)
            if budget <= 0:
                break
            if seq in plan.preempted:
                continue
            n = min(len(seq.tokens) - seq.computed, budget, self.config.prefill_chunk)
            if self._reserve(seq, n, plan):
                plan.items.append((seq, n))
                budget -= n
        while not plan.preempted and budget > 0 and self.waiting:
            if len(self.running) >= self.config.max_running:
                break
            n = self._admit(self.waiting[0], budget, plan)
            if n == 0:
                break
            seq = self.waiting.popleft()
            self.running.append(seq)
            plan.items.append((seq, n))
            budget -= n
        return plan

    def stepped(self, plan: Plan) -> None:
        """The model computed the plan's tokens: full prompt blocks become shareable."""
        b = self.config.block_size
        for seq, n in plan.items:
            seq.computed += n
            full = min(seq.computed, seq.prompt_len) // b
            for j in range(seq.registered, full):
                self.pool.register(seq.blocks[j], seq.hashes[j])
            seq.registered = max(seq.registered, full)

    def finish(self, seq: Sequence) -> None:
        """Retire ``seq`` (finished, cancelled, failed): its blocks are free at once."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._release(seq)

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.config.block_size)

    def _reserve(self, seq: Sequence, n: int, plan: Plan) -> bool:
        """Blocks for ``seq``'s next ``n`` tokens (own copies of shared ones it writes
        into), preempting the sequences admitted last as needed; False when ``seq``
        itself was preempted."""
        b = self.config.block_size
        first, last = seq.computed // b, (seq.computed + n - 1) // b
        shared = [
            j
            for j in range(first, min(last + 1, len(seq.blocks)))
            if self.pool.needs_copy(seq.blocks[j])
        ]
        need = self._blocks_for(seq.computed + n) - len(seq.blocks) + len(shared)
        while self.pool.num_free < need:
            victim = self.running[-1]
            self._preempt(victim, plan)
            if victim is seq:
                return False
        for j in shared:
            fresh = self.pool.copy_on_write(seq.blocks[j])
            assert fresh is not None  # (reserved above)
            plan.copies.append((seq.blocks[j], fresh))
            seq.blocks[j] = fresh
        grown = self.pool.allocate(self._blocks_for(seq.computed + n) - len(seq.blocks))
        assert grown is not None
        seq.blocks.extend(grown)
        return True

    def _admit(self, seq: Sequence, budget: int, plan: Plan) -> int:
        """Take the blocks of ``seq``'s first chunk (its shared prefix first); the chunk's
        token count, or 0 (nothing taken) when the pool lacks them."""
        b = self.config.block_size
        # (the last prompt token is always computed: its logits give the first output)
        usable = min(len(seq.hashes), (len(seq.tokens) - 1) // b)
        seq.blocks = self.pool.share(seq.hashes[:usable])
        seq.computed = len(seq.blocks) * b
        seq.registered = len(seq.blocks)
        n = min(len(seq.tokens) - seq.computed, budget, self.config.prefill_chunk)
        grown = self.pool.allocate(self._blocks_for(seq.computed + n) - len(seq.blocks))
        if grown is None:
            self._release(seq)
            return 0
        seq.blocks.extend(grown)
        if not seq.preemptions:
            self.prompt_tokens += seq.prompt_len
            self.prefix_hit_tokens += seq.computed
        return n

    def _preempt(self, seq: Sequence, plan: Plan) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)
        plan.preempted.append(seq)
        plan.items = [(s, n) for s, n in plan.items if s is not seq]

    def _release(self, seq: Sequence) -> None:
        self.pool.free(seq.blocks)
        seq.blocks = []
        seq.computed = 0
        seq.registered = 0
