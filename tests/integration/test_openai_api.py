"""The OpenAI-compatible API (/v1/models, /v1/completions, /v1/chat/completions) with
the official ``openai`` client against a real server, over the stand-in generative model
(tests/generative_standin_model.py): greedy, it answers the prompt reversed, one token
per UTF-8 byte, so every answer and count is known in advance.

``standin`` has a tokenizer (it counts usage: the model sends no counts), a chat template
of its own, finish reasons and logprobs;
``standin_bare`` has no tokenizer (counts from its num_*_tokens outputs), the default
(ChatML) template, no logprobs, and no exclude_input_in_output (it repeats the prompt
first, which the API takes off); ``identity`` is no generative model."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.generative import write_standin
from tests.repos import write_identity
from tests.serverctl import ShoalServer, free_port, served

TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
CHATML = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo: Path = tmp_path_factory.mktemp("openai_repo")
    extras = ("finish_reason", "cumulative_logprob", "logprobs")
    write_standin(repo, "standin", template=TEMPLATE, outputs=extras)
    write_standin(
        repo,
        "standin_bare",
        tokenizer=False,
        outputs=("num_input_tokens", "num_output_tokens"),
        exclude_input=False,
    )
    write_identity(repo, "identity")
    with served(repo, f"--openai-port={free_port()}") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: ShoalServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"http://{server.url}/v1", api_key="unused", max_retries=0, timeout=30
    ) as c:
        yield c


def test_models_lists_the_generative_models_only(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == ["standin", "standin_bare"]
    assert all(m.owned_by == "shoal" and m.object == "model" for m in models)
    assert abs(models[0].created - time.time()) < 3600
    assert client.models.retrieve("standin").id == "standin"
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("identity")
    assert err.value.code == "model_not_found"


def test_the_openai_port_serves_the_api_too(server: ShoalServer) -> None:
    port = next(a.split("=")[1] for a in server.args if a.startswith("--openai-port="))
    with openai.OpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=30
    ) as other:
        c = other.completions.create(model="standin", prompt="port", max_tokens=10)
    assert c.choices[0].text == "trop"


def test_a_completion_and_its_usage(client: openai.OpenAI) -> None:
    c = client.completions.create(model="standin", prompt="héllo", max_tokens=50)
    assert c.id.startswith("cmpl-") and c.object == "text_completion"
    assert c.model == "standin" and c.system_fingerprint
    assert [(ch.index, ch.text, ch.finish_reason) for ch in c.choices] == [(0, "olléh", "stop")]
    assert c.usage is not None
    assert (c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens) == (6, 6, 12)


def test_a_long_prompt_is_counted_all_the_same(client: openai.OpenAI) -> None:
    """(Counted by the tokenizer off the event loop: over 4 KiB of text.)"""
    c = client.completions.create(model="standin", prompt="aé" * 3000, max_tokens=6)
    assert (c.choices[0].text, c.choices[0].finish_reason) == ("éaéa", "length")
    assert c.usage is not None
    assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (9000, 6)


def test_max_tokens_ends_with_length_and_echo_repeats_the_prompt(client: openai.OpenAI) -> None:
    c = client.completions.create(model="standin", prompt="abcdef", max_tokens=3, echo=True)
    assert (c.choices[0].text, c.choices[0].finish_reason) == ("abcdeffed", "length")
    assert c.usage is not None and c.usage.completion_tokens == 3


def test_a_streamed_completion_with_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model="standin",
            prompt="stream me",
            max_tokens=100,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == "em maerts"
    assert len([ch for ch in chunks if ch.choices]) > 1  # token by token
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (9, 9)
    assert all(ch.usage is None for ch in chunks[:-1])


def test_stop_strings_cut_the_text(client: openai.OpenAI) -> None:
    c = client.completions.create(model="standin", prompt="abc-def", max_tokens=50, stop=["-"])
    assert (c.choices[0].text, c.choices[0].finish_reason) == ("fed", "stop")
    streamed = client.completions.create(
        model="standin", prompt="xyz stop abc", max_tokens=50, stop="po", stream=True
    )
    assert "".join(ch.choices[0].text for ch in streamed) == "cba "


def test_a_list_of_prompts_and_n_choices(client: openai.OpenAI) -> None:
    c = client.completions.create(model="standin", prompt=["ab", "cd"], n=2, max_tokens=10)
    assert [(ch.index, ch.text) for ch in c.choices] == [(0, "ba"), (1, "ba"), (2, "dc"), (3, "dc")]
    assert c.usage is not None and (c.usage.prompt_tokens, c.usage.completion_tokens) == (4, 8)


def test_a_seed_repeats_sampled_choices_and_n_derives_seeds(client: openai.OpenAI) -> None:
    def sample(seed: int, n: int) -> list[str]:
        c = client.completions.create(
            model="standin", prompt="x", temperature=1.0, seed=seed, n=n, max_tokens=64
        )
        return [ch.text for ch in c.choices]

    first = sample(7, 3)
    assert sample(7, 3) == first
    assert len(set(first)) == 3  # each choice its own seed
    assert sample(8, 1) == [first[1]]  # choice k of seed s: seed s + k


def test_a_chat_completion_through_the_models_template(client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    c = client.chat.completions.create(model="standin", messages=messages, max_tokens=200)
    prompt = "system: be brief\nuser: hi\nassistant:"
    assert c.id.startswith("chatcmpl-") and c.object == "chat.completion"
    assert c.choices[0].message.role == "assistant"
    assert c.choices[0].message.content == prompt[::-1]
    assert c.usage is not None
    assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (len(prompt), len(prompt))


def test_a_streamed_chat_without_a_tokenizer_counts_from_the_model(
    client: openai.OpenAI,
) -> None:
    """standin_bare: the default template (ChatML), counts from num_*_tokens, the
    prompt it repeats taken off."""
    chunks = list(
        client.chat.completions.create(
            model="standin_bare",
            messages=[{"role": "user", "content": "hi"}],
            max_completion_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == CHATML[::-1][:10]
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    usage = chunks[-1].usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (len(CHATML), 10)
    whole = client.completions.create(model="standin_bare", prompt="xyz", max_tokens=5)
    assert (whole.choices[0].text, whole.choices[0].finish_reason) == ("zyx", "stop")


def test_logprobs_where_the_model_gives_them(client: openai.OpenAI) -> None:
    c = client.chat.completions.create(
        model="standin",
        messages=[{"role": "user", "content": "a"}],
        max_tokens=2,
        logprobs=True,
        top_logprobs=2,
    )
    lp = c.choices[0].logprobs
    assert lp is not None and lp.content is not None
    assert [(t.token, t.logprob) for t in lp.content] == [(":", -0.25), ("t", -0.25)]
    assert [(t.token, t.logprob) for t in lp.content[0].top_logprobs] == [(":", -0.25), (";", -2.0)]
    comp = client.completions.create(model="standin", prompt="ab", max_tokens=5, logprobs=1)
    legacy = comp.choices[0].logprobs
    assert legacy is not None
    assert (legacy.tokens, legacy.token_logprobs, legacy.text_offset) == (
        ["b", "a"],
        [-0.25, -0.25],
        [0, 1],
    )
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="standin_bare", messages=[{"role": "user", "content": "a"}], logprobs=True
        )
    assert err.value.param == "logprobs"


def test_bad_requests_are_refused_in_openais_shape(
    client: openai.OpenAI, server: ShoalServer
) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="nope", prompt="x")
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as hot:
        client.completions.create(model="standin", prompt="x", temperature=5)
    assert hot.value.param == "temperature"
    status, body = server.http(
        "/v1/chat/completions",
        json.dumps({"model": "standin", "messages": [], "bogus": 1}).encode(),
        {"Content-Type": "application/json"},
    )
    error = json.loads(body)["error"]
    assert status == 400 and error["type"] == "invalid_request_error"
    assert set(error) == {"message", "type", "param", "code"}
    status, body = server.http("/v1/completions", b"{not json", {})
    assert status == 400 and "error" in json.loads(body)


def test_a_model_that_raises_fails_the_request_and_the_server_stays(
    client: openai.OpenAI,
) -> None:
    with pytest.raises(openai.InternalServerError) as err:
        client.completions.create(model="standin", prompt="[raise]")
    assert "standin raised" in str(err.value)
    chunks = client.completions.create(
        model="standin", prompt="abcdefgh[fail-mid]", max_tokens=50, stream=True
    )
    texts = []
    with pytest.raises(openai.APIError) as mid:
        for ch in chunks:
            texts.append(ch.choices[0].text)
    assert "standin failed mid-stream" in str(mid.value)
    assert "".join(texts) == "]di"  # the three tokens before the failure
    assert client.completions.create(model="standin", prompt="ok").choices[0].text == "ko"


@pytest.mark.parametrize("n", [1, 2])
def test_a_client_that_leaves_cancels_the_request_in_the_model(server: ShoalServer, n: int) -> None:
    """Each choice's request (one read directly, two side by side) is cancelled."""
    before = server.log().count("standin cancelled after")
    conn = http.client.HTTPConnection(server.url, timeout=30)
    body = {"model": "standin", "prompt": "[slow]" * 20, "max_tokens": 100, "stream": True, "n": n}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    running: set[int] = set()  # choices whose first token came: their requests run
    while len(running) < n:
        line = resp.readline()
        assert line, "the stream ended before every choice began"
        if line.startswith(b"data: "):
            running.add(json.loads(line[6:])["choices"][0]["index"])
    conn.close()
    deadline = time.monotonic() + 20

    def cancelled() -> int:
        return server.log().count("standin cancelled after") - before

    while cancelled() < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cancelled() == n


def test_an_instance_that_dies_mid_stream_ends_the_stream_with_an_error(
    client: openai.OpenAI, server: ShoalServer
) -> None:
    """(Last: the instance restarts after it.)"""
    chunks = client.completions.create(
        model="standin", prompt="abcdefgh[crash]", max_tokens=50, stream=True
    )
    texts = []
    with pytest.raises(openai.APIError) as err:
        for ch in chunks:
            texts.append(ch.choices[0].text)
    # what came before the end: the tokens sent before the exit, or fewer (the broker's
    # word of the exit and the worker's last answers travel on different sockets)
    assert "]hs".startswith("".join(texts))
    assert "worker process" in err.value.message and "exited" in err.value.message
    assert server.http_status("/v2/health/live") == 200
