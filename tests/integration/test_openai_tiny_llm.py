"""The OpenAI-compatible API over model_repository's tiny_llm (a seeded random transformer
served by the generative engine, docs/generative-models.md), with the official
``openai`` client: the API and the engine meet at the generative contract."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.serverctl import served

SHIPPED = Path(__file__).resolve().parents[2] / "model_repository" / "tiny_llm"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    repo: Path = tmp_path_factory.mktemp("tiny_llm_repo")
    shutil.copytree(SHIPPED, repo / "tiny_llm")
    with (
        served(repo) as srv,
        openai.OpenAI(
            base_url=f"http://{srv.url}/v1", api_key="unused", max_retries=0, timeout=60
        ) as c,
    ):
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
