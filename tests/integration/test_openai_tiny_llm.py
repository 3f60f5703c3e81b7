"""The OpenAI-compatible API over model_repository's tiny_llm (a seeded random transformer
served by the generative engine, docs/generative-models.md), with the official
``openai`` client: the API and the engine meet at the generative contract."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.serverctl import ShoalServer, served

SHIPPED = Path(__file__).resolve().parents[2] / "model_repository" / "tiny_llm"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    """Two frontend processes (the port shared), each with its own API state."""
    repo: Path = tmp_path_factory.mktemp("tiny_llm_repo")
    shutil.copytree(SHIPPED, repo / "tiny_llm")
    with served(repo, "--frontend-processes=2") as srv:
        yield srv


def _client(srv: ShoalServer) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"http://{srv.url}/v1", api_key="unused", max_retries=0, timeout=60
    )


@pytest.fixture(scope="module")
def client(server: ShoalServer) -> Iterator[openai.OpenAI]:
    with _client(server) as c:
        yield c


def test_tiny_llm_is_listed(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == ["tiny_llm"]


def test_greedy_completions_repeat_and_stream_the_same_text(client: openai.OpenAI) -> None:
    ask = {"model": "tiny_llm", "prompt": "Once upon", "max_tokens": 12, "temperature": 0}
    whole = client.completions.create(**ask, extra_body={"ignore_eos": True})
    again = client.completions.create(**ask, extra_body={"ignore_eos": True})
    assert whole.choices[0].text == again.choices[0].text
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 12
    chunks = list(
        client.completions.create(
            **ask, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )  # fmt: skip
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == whole.choices[0].text
    assert chunks[-1].usage == whole.usage


def test_penalties_reach_the_engine(client: openai.OpenAI) -> None:
    ask = {"model": "tiny_llm", "prompt": "Once upon", "max_tokens": 24, "temperature": 0}
    plain = client.completions.create(**ask, extra_body={"ignore_eos": True})
    penalized = [
        client.completions.create(**ask, frequency_penalty=2.0, extra_body={"ignore_eos": True})
        for _ in range(2)
    ]
    texts = [c.choices[0].text for c in penalized]
    assert texts[0] == texts[1] != plain.choices[0].text


def test_seeded_chat_choices_and_their_logprobs(client: openai.OpenAI) -> None:
    ask = {
        "model": "tiny_llm",
        "messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": 6,
        "temperature": 0.9,
        "seed": 5,
        "n": 2,
        "logprobs": True,
        "top_logprobs": 3,
        "extra_body": {"ignore_eos": True},
    }
    first = client.chat.completions.create(**ask)
    second = client.chat.completions.create(**ask)
    texts = [c.message.content for c in first.choices]
    assert texts == [c.message.content for c in second.choices]
    assert first.usage is not None and first.usage.completion_tokens == 12
    for choice in first.choices:
        lp = choice.logprobs
        assert lp is not None and lp.content is not None and len(lp.content) == 6
        for token in lp.content:
            tops = [t.logprob for t in token.top_logprobs]
            assert len(tops) == 3 and tops == sorted(tops, reverse=True)
            assert token.logprob <= 0


def test_each_frontend_process_answers_v1_alike(server: ShoalServer) -> None:
    """A client on a new connection lands on either frontend (SO_REUSEPORT); each reads
    the model's tokenizer and chat template itself and gives the same greedy answer."""
    ask = {
        "model": "tiny_llm",
        "messages": [{"role": "user", "content": "hello"}],
        "max_completion_tokens": 8,
        "temperature": 0,
        "logprobs": True,
        "extra_body": {"ignore_eos": True},
    }
    answers: dict[str, tuple[str | None, list[float]]] = {}
    deadline = time.monotonic() + 60  # (the second frontend may still be starting)
    while len(answers) < 2 and time.monotonic() < deadline:
        with _client(server) as c:  # (a new connection)
            raw = c.chat.completions.with_raw_response.create(**ask)
        reply = raw.parse()
        content = reply.choices[0].logprobs
        assert content is not None and content.content is not None
        answers[raw.headers["shoal-frontend"]] = (
            reply.choices[0].message.content,
            [t.logprob for t in content.content],
        )
    assert set(answers) == {"0", "1"}
    assert answers["0"] == answers["1"] and len(answers["0"][1]) == 8
