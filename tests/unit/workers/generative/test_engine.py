"""The engine over the shipped tiny_llm, in process: in-flight batching gives each request
the tokens it gets alone (greedy and seeded sampling, with and without preemption), and
retiring a request (finished, cancelled, timed out) frees its blocks at once."""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from shoal.workers.generative.engine import Engine, Output
from shoal.workers.generative.interface import KvCache
from shoal.workers.generative.sampler import InvalidSampling, SamplingParams
from shoal.workers.generative.scheduler import SchedulerConfig

TINY = Path(__file__).resolve().parents[4] / "model_repository" / "tiny_llm"
GREEDY = '{"temperature": 0, "max_tokens": 24, "ignore_eos": true}'
SEEDED = '{"temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": 11, "max_tokens": 24}'
PENALIZED = (
    '{"temperature": 0.8, "seed": 4, "frequency_penalty": 1.5, "presence_penalty": 0.5, '
    '"max_tokens": 24, "ignore_eos": true}'
)


@pytest.fixture(scope="module")
def model() -> Any:
    spec = importlib.util.spec_from_file_location("tiny_llm_model", TINY / "1" / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TinyLlm({"torch_threads": "1", "dtype": "float64"})


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TINY / "tokenizer.json"))


def _engine(model: Any, tokenizer: Tokenizer, blocks: int, step_tokens: int = 64) -> Engine:
    kv = KvCache.allocate(model.kv_layout(), blocks, 4, "cpu")
    config = SchedulerConfig(
        block_size=4, max_running=16, max_step_tokens=step_tokens, prefill_chunk=8
    )
    return Engine(model, kv, blocks, config, tokenizer.decode)


def _generate(
    engine: Engine, requests: dict[Hashable, tuple[str, str]], tok: Tokenizer
) -> dict[Hashable, list[Output]]:
    for key, (prompt, params) in requests.items():
        engine.add(key, tok.encode(prompt).ids, SamplingParams.parse(params), 0.0)
    got: dict[Hashable, list[Output]] = {}
    while engine.has_work():
        for out in engine.step(0.0):
            got.setdefault(out.handle, []).append(out)
    return got


def _tokens(outs: list[Output]) -> list[int]:
    return [t for o in outs for t in o.new_tokens]


# ("": the prompt is <bos> alone, admitted after the others' chunks with 1 token: the
# model computes it with the decodes, so the step's logits come back reordered)
PROMPTS = ["Hello there", "abc", "The quick brown fox jumps over the lazy dog", "x" * 37, "hi", ""]


@pytest.mark.parametrize("params", [GREEDY, SEEDED, PENALIZED])
@pytest.mark.parametrize("blocks", [200, 40])  # (40: too few for all: preemptions)
def test_batched_outputs_equal_outputs_alone(
    model: Any, tokenizer: Tokenizer, params: str, blocks: int
) -> None:
    alone = {
        i: _tokens(_generate(_engine(model, tokenizer, 200), {i: (p, params)}, tokenizer)[i])
        for i, p in enumerate(PROMPTS)
    }
    engine = _engine(model, tokenizer, blocks)
    together = _generate(engine, {i: (p, params) for i, p in enumerate(PROMPTS)}, tokenizer)
    assert {i: _tokens(o) for i, o in together.items()} == alone
    assert (engine.scheduler.preemptions > 0) == (blocks == 40)
    assert engine.pool.num_used == 0
    for outs in together.values():  # each token once, the last output finished
        assert [o.finish for o in outs][-1] in ("length", "stop")
        assert outs[0].first and not any(o.first for o in outs[1:])


def test_the_model_own_loop_gives_the_engine_greedy_tokens(
    model: Any, tokenizer: Tokenizer
) -> None:
    ids = tokenizer.encode(PROMPTS[2]).ids
    own = list(model.generate(ids, 24, ignore_eos=True))
    got = _generate(_engine(model, tokenizer, 64), {0: (PROMPTS[2], GREEDY)}, tokenizer)
    assert _tokens(got[0]) == own


def test_penalties_reach_the_sampler_with_the_tokens_generated(
    model: Any, tokenizer: Tokenizer
) -> None:
    plain = _tokens(_generate(_engine(model, tokenizer, 64), {0: ("Hello", GREEDY)}, tokenizer)[0])
    penalized = GREEDY.replace("}", ', "frequency_penalty": 2.0}')
    got = _tokens(_generate(_engine(model, tokenizer, 64), {0: ("Hello", penalized)}, tokenizer)[0])
    assert len(got) == len(plain) and got != plain
    assert max(got.count(t) for t in got) < max(plain.count(t) for t in plain)


def test_cancel_and_timeout_retire_requests_and_free_their_blocks(
    model: Any, tokenizer: Tokenizer
) -> None:
    engine = _engine(model, tokenizer, 64)
    ids = tokenizer.encode("a prompt of some length").ids
    engine.add("cancelled", ids, SamplingParams.parse('{"max_tokens": 100}'), 0.0)
    engine.add("timed", ids, SamplingParams.parse('{"max_tokens": 100, "timeout": 1.5}'), 0.0)
    engine.add("kept", ids, SamplingParams.parse('{"max_tokens": 100, "ignore_eos": true}'), 0.0)
    for t in range(3):
        engine.step(float(t) / 10)
    used = engine.pool.num_used
    out = engine.cancel("cancelled")
    assert out is not None and out.finish == "cancelled"
    assert engine.pool.num_used < used and engine.cancel("cancelled") is None
    (timed,) = [o for o in engine.step(2.0) if o.handle == "timed"]
    assert timed.finish == "abort" and engine.stats()["running"] == 1
    engine.cancel("kept")
    assert engine.pool.num_used == 0 and not engine.has_work()


def test_a_stop_string_ends_the_sequence_without_it(model: Any, tokenizer: Tokenizer) -> None:
    full = _generate(_engine(model, tokenizer, 64), {0: ("Hello", GREEDY)}, tokenizer)[0]
    text = "".join(o.text for o in full)
    stop = text[5:8]
    params = GREEDY.replace("}", f', "stop": ["{stop}"]}}')
    got = _generate(_engine(model, tokenizer, 64), {0: ("Hello", params)}, tokenizer)[0]
    assert "".join(o.text for o in got) == text[: text.index(stop)]
    assert got[-1].finish == "stop"


def test_a_request_that_can_never_fit_is_refused(model: Any, tokenizer: Tokenizer) -> None:
    engine = _engine(model, tokenizer, 8)  # 32 tokens
    with pytest.raises(InvalidSampling, match="KV cache"):
        engine.add(0, list(range(20)), SamplingParams.parse('{"max_tokens": 20}'), 0.0)
    with pytest.raises(InvalidSampling, match="at most 1023"):
        engine.add(1, [1] * 2000, SamplingParams.parse("{}"), 0.0)
    assert not engine.has_work()


def test_random_soak_leaves_no_block_held(model: Any, tokenizer: Tokenizer) -> None:
    rng = random.Random(5)
    engine = _engine(model, tokenizer, 48, step_tokens=32)
    for i in range(60):
        prompt = "".join(chr(rng.randrange(97, 123)) for _ in range(rng.randrange(1, 30)))
        engine.add(i, tokenizer.encode(prompt).ids, SamplingParams.parse('{"max_tokens": 12}'), 0.0)
        if rng.random() < 0.3:
            engine.cancel(rng.randrange(i + 1))  # (one finished already: nothing happens)
        engine.step(0.0)
    while engine.has_work():
        engine.step(0.0)
    assert engine.pool.num_used == 0 and engine.pool.num_free == 48
