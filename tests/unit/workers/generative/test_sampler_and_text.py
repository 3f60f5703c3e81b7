"""Sampling (greedy, temperature, top-k, top-p, seeds, penalties) and the output text (incremental
decoding, stop strings)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from shoal.workers.generative.sampler import InvalidSampling, SamplingParams, sample
from shoal.workers.generative.text import OutputText


def _draws(params: SamplingParams, logits: torch.Tensor, count: int) -> list[int]:
    g = params.generator()
    return [sample(logits[None], [params], [g])[0].token for _ in range(count)]


def test_greedy_takes_the_most_likely_token_and_reports_its_logprob() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 0.0]])
    p = SamplingParams.parse('{"temperature": 0, "logprobs": 2}')
    out = sample(logits, [p, p], [None, None])
    assert [o.token for o in out] == [1, 0]
    assert out[0].logprob == pytest.approx(float(torch.log_softmax(logits[0].double(), -1)[1]))
    assert [t for t, _ in out[0].top] == [1, 2]


def test_a_seed_gives_the_same_tokens_and_top_k_top_p_bound_them() -> None:
    logits = torch.linspace(0, 2, 50)
    p = SamplingParams.parse('{"temperature": 1.0, "seed": 3}')
    assert _draws(p, logits, 40) == _draws(p, logits, 40)
    assert len(set(_draws(p, logits, 200))) > 10
    top_k = SamplingParams.parse('{"temperature": 1.0, "seed": 3, "top_k": 3}')
    assert set(_draws(top_k, logits, 200)) <= {47, 48, 49}
    sharp = torch.tensor([10.0, 9.0, 0.0, 0.0])  # the first two hold ~all the mass
    top_p = SamplingParams.parse('{"temperature": 1.0, "seed": 1, "top_p": 0.5}')
    assert set(_draws(top_p, sharp, 100)) == {0}


def test_penalties_lower_what_the_sequence_generated_as_openai_defines() -> None:
    logits = torch.tensor([[0.0, 1.0, 0.5, 0.7]])
    said = [[1, 1, 3]]  # token 1 twice, token 3 once

    def greedy(extra: str) -> tuple[int, float]:
        p = SamplingParams.parse('{"temperature": 0' + extra + "}")
        (pick,) = sample(logits, [p], [None], said)
        return pick.token, pick.logprob

    assert greedy("")[0] == 1
    # 1.0 - 2 * 0.3 = 0.4 and 0.7 - 0.3 = 0.4 fall under 0.5 (token 2, never said)
    token, logprob = greedy(', "frequency_penalty": 0.3')
    assert token == 2
    expected = torch.log_softmax(torch.tensor([0.0, 0.4, 0.5, 0.4], dtype=torch.float64), -1)
    assert logprob == pytest.approx(float(expected[2]))
    # presence counts once: 1.0 - 0.3 = 0.7 stays first
    assert greedy(', "presence_penalty": 0.3')[0] == 1
    assert greedy(', "presence_penalty": 0.3, "frequency_penalty": 0.2')[0] == 2
    assert greedy(', "frequency_penalty": -1.0')[0] == 1  # negative: more of the same
    (plain,) = sample(logits, [SamplingParams.parse('{"temperature": 0}')], [None], said)
    assert plain.token == 1  # no penalty asked: what it said does not count


def test_penalized_draws_repeat_for_a_seed_and_spread_out() -> None:
    logits = torch.linspace(0, 4, 30)[None]  # the last few tokens hold most of the mass

    def run(extra: str) -> list[int]:
        p = SamplingParams.parse('{"temperature": 1.0, "seed": 9' + extra + "}")
        g, said = p.generator(), []
        for _ in range(40):
            said.append(sample(logits, [p], [g], [list(said)])[0].token)
        return said

    penalized = run(', "frequency_penalty": 2.0')
    assert penalized == run(', "frequency_penalty": 2.0')
    assert len(set(penalized)) > len(set(run(""))) + 5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"temperature": -1}', "temperature must be at least 0.0"),
        ('{"top_p": 0}', "top_p must be in (0, 1]"),
        ('{"max_tokens": 1.5}', "max_tokens must be an integer"),
        ('{"stop": [1]}', "stop must be a string or a list of strings"),
        ("[1]", "sampling_parameters must be a JSON object"),
        ("{", "sampling_parameters is not valid JSON"),
        ('{"n": 2}', "n > 1 is not supported: send n requests"),
        ('{"presence_penalty": 2.5}', "presence_penalty must be at most 2.0"),
        ('{"frequency_penalty": -3}', "frequency_penalty must be at least -2.0"),
    ],
)
def test_invalid_sampling_parameters_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(InvalidSampling, match=message.replace("(", r"\(").replace("]", r"\]")):
        SamplingParams.parse(text)


def _bytes_decode(ids: list[int]) -> str:
    return bytes(ids).decode(errors="replace")


def test_a_partial_character_waits_for_the_next_token() -> None:
    text = OutputText(_bytes_decode, [])
    ids = list("é".encode())
    assert not text.update(ids[:1]) and text.take(False) == ""
    assert not text.update(ids) and text.take(False) == "é"


def test_a_stop_string_ends_the_text_and_is_never_half_sent() -> None:
    text = OutputText(_bytes_decode, ["END"])
    out: list[str] = []
    ids: list[int] = []
    for ch in b"abcEN":
        ids.append(ch)
        assert not text.update(ids)
        out.append(text.take(False))
    assert "".join(out) == "abc"  # "EN" held back: it may begin the stop string
    ids += list(b"Dxyz")
    assert text.update(ids)
    assert "".join(out) + text.take(True) == "abc"


def test_incremental_text_is_the_whole_outputs_decoding() -> None:
    """Token by token, invalid and partial UTF-8 and skipped special tokens included."""
    repo = Path(__file__).resolve().parents[4] / "model_repository" / "tiny_llm"
    tok = Tokenizer.from_file(str(repo / "tokenizer.json"))

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=True)

    rng = random.Random(3)
    pieces = [*range(256), *"héllo wörld ✓".encode(), 257]
    for _ in range(200):
        ids = [rng.choice(pieces) for _ in range(rng.randrange(1, 60))]
        text = OutputText(decode, [])
        for i in range(1, len(ids) + 1):
            text.update(ids[:i], final=i == len(ids))
        assert text.text == decode(ids)
