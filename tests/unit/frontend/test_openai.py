"""The OpenAI API's pure parts: request bodies, plans, chat templates, a choice's text as
it grows (stop strings, UTF-8 across responses, finish reasons), logprobs' two forms."""

from __future__ import annotations

import json
import random
import struct

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from shoal.dataplane.model_handle import ModelHandle
from shoal.dataplane.types import InferenceResult, OutputTensor
from shoal.frontend.openai import responses
from shoal.frontend.openai.chat_template import DEFAULT_TEMPLATE, ChatTemplate, TemplateError
from shoal.frontend.openai.generation import (
    ChoiceText,
    Piece,
    StopScanner,
    bytes_tensor,
    model_request,
    read_piece,
)
from shoal.frontend.openai.generative import GenerativeModel, follows_contract
from shoal.frontend.openai.plan import chat_plan, completion_plan
from shoal.frontend.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIError,
    decode,
)
from tests.generative import byte_tokenizer

CONFIG = """
name: "g" backend: "python" max_batch_size: 0
model_transaction_policy { decoupled: true }
input { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }
input { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }
input { name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true }
input { name: "return_num_output_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true }
output { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }
output { name: "num_output_tokens" data_type: TYPE_UINT32 dims: [ -1 ] }
"""


def _model(config: str = CONFIG, tokenizer: bool = True) -> GenerativeModel:
    handle = ModelHandle(
        "g", 1, [1], text_format.Parse(config, mc.ModelConfig()).SerializeToString()
    )
    return GenerativeModel(
        handle, 0, byte_tokenizer() if tokenizer else None, ChatTemplate(DEFAULT_TEMPLATE)
    )


def _error(body: bytes, kind: type = CompletionRequest) -> OpenAIError:
    with pytest.raises(OpenAIError) as err:
        decode(body, kind)
    return err.value


def test_bodies_are_refused_naming_the_field() -> None:
    e = _error(b'{"model": "g", "prompt": "x", "temperature": 3}')
    assert (e.status, e.param, e.type) == (400, "temperature", "invalid_request_error")
    assert _error(b'{"model": "g", "prompt": "x", "bogus": 1}').message == (
        "Unrecognized request argument supplied: bogus"
    )
    assert _error(b'{"prompt": "x"}').param == "model"
    assert _error(b'{"model": "g", "messages": []}', ChatCompletionRequest).param == "messages"
    assert _error(b'{"model": "g", "prompt": "x", "stop": ["a","b","c","d","e"]}').param == "stop"
    assert _error(b'{"model": "g", "prompt": "x", "n": "2"}').param == "n"
    assert _error(b"").status == _error(b"{oops").status == 400
    ok = decode(b'{"model": "g", "prompt": ["a", "b"], "stop": "z"}', CompletionRequest)
    assert (ok.prompt, ok.stop) == (["a", "b"], "z")


def test_a_plan_derives_one_seed_per_choice() -> None:
    model = _model()
    req = decode(b'{"model": "g", "prompt": ["a", "b"], "n": 3, "seed": 10}', CompletionRequest)
    plan = completion_plan(req, model, random.Random(0))
    assert [s["seed"] for s in plan.sampling] == [10, 11, 12, 10, 11, 12]
    assert plan.sampling[0]["max_tokens"] == 16  # OpenAI's default for completions
    assert [plan.prompt_of(i) for i in range(6)] == ["a"] * 3 + ["b"] * 3
    unseeded = completion_plan(
        decode(b'{"model": "g", "prompt": "a", "n": 2}', CompletionRequest),
        model,
        random.Random(0),
    )
    assert unseeded.sampling[1]["seed"] == unseeded.sampling[0]["seed"] + 1
    one = decode(b'{"model": "g", "prompt": "a"}', CompletionRequest)
    assert "seed" not in completion_plan(one, model, random.Random(0)).sampling[0]
    penalized = decode(
        b'{"model": "g", "prompt": "a", "presence_penalty": 0.5, "frequency_penalty": -1}',
        CompletionRequest,
    )
    sampling = completion_plan(penalized, model, random.Random(0)).sampling[0]
    assert (sampling["presence_penalty"], sampling["frequency_penalty"]) == (0.5, -1)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "g", "prompt": "a", "suffix": "z"}', "suffix"),
        (b'{"model": "g", "prompt": "a", "logit_bias": {"1": 2}}', "logit_bias"),
        (b'{"model": "g", "prompt": "a", "stream_options": {"include_usage": true}}',
         "stream_options"),
        (b'{"model": "g", "prompt": ["a", "b"], "n": 100}', "n"),
        (b'{"model": "g", "prompt": "a", "logprobs": 1}', "logprobs"),  # no logprobs output
        (b'{"model": "g", "prompt": [1, 999]}', "prompt"),
        (b'{"model": "g", "prompt": [1, "a"]}', "prompt"),
    ],
)  # fmt: skip
def test_a_plan_refuses_what_the_model_cannot_do(body: bytes, param: str) -> None:
    with pytest.raises(OpenAIError) as err:
        completion_plan(decode(body, CompletionRequest), _model(), random.Random(0))
    assert (err.value.status, err.value.param) == (400, param)


def test_top_logprobs_ask_the_model_for_alternatives() -> None:
    config = CONFIG + 'output { name: "logprobs" data_type: TYPE_STRING dims: [ -1 ] }'
    body = b'{"model": "g", "messages": [{"role": "user", "content": "a"}], "logprobs": true, '
    wants = b'"top_logprobs": 3}'
    plan = chat_plan(decode(body + wants, ChatCompletionRequest), _model(config), random.Random())
    assert (plan.top_logprobs, plan.sampling[0]["logprobs"], "logprobs" in plan.want) == (
        3,
        3,
        True,
    )
    chosen_only = chat_plan(decode(body[:-2] + b"}", ChatCompletionRequest), _model(config),
                            random.Random())  # fmt: skip
    assert chosen_only.top_logprobs == 0 and "logprobs" not in chosen_only.sampling[0]
    none = b'{"model": "g", "messages": [{"role": "user", "content": "a"}]}'
    plain = chat_plan(decode(none, ChatCompletionRequest), _model(config), random.Random())
    assert plain.top_logprobs is None and "logprobs" not in plain.want


def test_token_prompts_need_a_tokenizer() -> None:
    req = decode(b'{"model": "g", "prompt": [[104, 105], [111]]}', CompletionRequest)
    assert completion_plan(req, _model(), random.Random(0)).prompts == ["hi", "o"]
    with pytest.raises(OpenAIError):
        completion_plan(req, _model(tokenizer=False), random.Random(0))


def test_chat_plans_render_the_template() -> None:
    body = (
        b'{"model": "g", "max_completion_tokens": 5, "max_tokens": 9, "messages": '
        b'[{"role": "user", "content": [{"type": "text", "text": "h"}, '
        b'{"type": "text", "text": "i"}]}]}'
    )
    plan = chat_plan(decode(body, ChatCompletionRequest), _model(), random.Random(0))
    assert plan.prompts == ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"]
    assert plan.max_tokens == 5 and plan.top_logprobs is None
    image = b'{"model": "g", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}'
    with pytest.raises(OpenAIError) as err:
        chat_plan(decode(image, ChatCompletionRequest), _model(), random.Random(0))
    assert err.value.param == "messages[0].content"


def test_templates_run_sandboxed_and_may_refuse() -> None:
    t = ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
        "{{ bos_token }}{{ messages | tojson }}",
        bos_token="<s>",
    )
    assert t.render([{"role": "user", "content": "é"}]) == '<s>[{"role": "user", "content": "é"}]'
    with pytest.raises(TemplateError, match="user first"):
        t.render([{"role": "system", "content": ""}])
    with pytest.raises(TemplateError):
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render([])
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate("{% for %}")


def test_stop_strings_are_cut_even_across_pieces() -> None:
    s = StopScanner(["STOP", "xy"])
    assert s.feed("abcST") == ("abc", False)  # "ST" may begin "STOP": held
    assert s.feed("O") == ("", False)
    assert s.feed("P and more") == ("", True)
    s = StopScanner(["STOP", "xy"])
    assert s.feed("STOx") == ("STO", False)  # "x" may begin "xy"
    assert s.feed("z") == ("xz", False)
    s = StopScanner(["STOP"])
    assert s.feed("ST") == ("", False)
    assert s.feed("ay") == ("STay", False)  # not a stop after all: let go
    assert (s.feed("S"), s.flush()) == (("", False), "S")
    assert StopScanner([]).feed("STOP") == ("STOP", False)


def test_a_choice_decodes_utf8_across_responses_and_ends_with_a_reason() -> None:
    c = ChoiceText(0, StopScanner([]), max_tokens=3, count=lambda s: len(s.encode()))
    e = "é".encode()
    assert c.add(Piece(text=b"a" + e[:1]), False) == ("a", [])
    assert c.add(Piece(text=e[1:]), True) == ("é", [])
    assert (c.text, c.finish_reason, c.completion_tokens()) == ("aé", "length", 3)
    said = ChoiceText(0, StopScanner([]), max_tokens=3)
    said.add(Piece(text=b"ab", finish_reason="stop", num_output_tokens=7), True)
    assert (said.finish_reason, said.completion_tokens()) == ("stop", 7)
    over = ChoiceText(0, StopScanner([]), max_tokens=2)
    over.add(Piece(text=b"ab", num_output_tokens=2), False)  # the model goes on
    assert (over.done, over.finish_reason, over.text) == (True, "length", "ab")
    cut = ChoiceText(0, StopScanner(["b"]), max_tokens=None)
    assert cut.add(Piece(text=b"abc"), False) == ("a", [])
    assert cut.done and cut.finish_reason == "stop"
    assert cut.add(Piece(text=b"more"), True) == ("", [])


def test_a_prompt_the_model_repeats_is_taken_off() -> None:
    """A model without exclude_input_in_output repeats the prompt first (vLLM's default),
    whole or across responses; a text that only looks like it at first is kept."""
    whole = ChoiceText(0, StopScanner([]), None, echoed=b"hi ")
    assert whole.add(Piece(text=b"hi there"), True) == ("there", [])
    split = ChoiceText(0, StopScanner([]), None, echoed=b"hi ")
    assert [split.add(Piece(text=t), False)[0] for t in (b"h", b"i", b" t", b"o")] == [
        "", "", "t", "o"
    ]  # fmt: skip
    other = ChoiceText(0, StopScanner([]), None, echoed=b"hi ")
    assert [other.add(Piece(text=t), False)[0] for t in (b"h", b"o")] == ["", "ho"]
    short = ChoiceText(0, StopScanner([]), None, echoed=b"hi ")
    assert short.add(Piece(text=b"h"), True) == ("h", [])


def test_requests_carry_only_the_inputs_the_model_has() -> None:
    model = _model()
    req = model_request(model, "hi", {"max_tokens": 2}, True, ("finish_reason",
                        "num_output_tokens"), "r-0")  # fmt: skip
    names = {t.name: bytes(t.data or b"") for t in req.inputs}
    assert set(names) == {"text_input", "stream", "sampling_parameters", "return_num_output_tokens"}
    assert names["text_input"] == bytes_tensor([b"hi"]) and names["stream"] == b"\x01"
    assert names["sampling_parameters"] == bytes_tensor([b'{"max_tokens":2}'])
    assert follows_contract(model.handle)
    plain = CONFIG.replace("decoupled: true", "decoupled: false")
    assert not follows_contract(_model(plain).handle)


def test_responses_are_read_with_their_extras() -> None:
    outs = [
        OutputTensor("text_output", "BYTES", [1], memoryview(bytes_tensor([b"ab"]))),
        OutputTensor("finish_reason", "BYTES", [1], memoryview(bytes_tensor([b"length"]))),
        OutputTensor("num_output_tokens", "UINT32", [1], memoryview(struct.pack("<I", 9))),
        OutputTensor("logprobs", "BYTES", [1], memoryview(bytes_tensor([b"not json"]))),
    ]
    piece = read_piece(InferenceResult("g", "1", outputs=outs))
    assert (piece.text, piece.finish_reason, piece.num_output_tokens, piece.logprobs) == (
        b"ab",
        "length",
        9,
        None,
    )


def test_logprobs_in_both_of_openais_forms() -> None:
    entries = [
        {"104": {"logprob": -0.1, "rank": 1, "decoded_token": "h"},
         "105": {"logprob": -3.0, "rank": 2, "decoded_token": "i"}},
        {"33": {"logprob": -2.5, "rank": 3, "decoded_token": "!"},
         "46": {"logprob": -0.5, "rank": 1, "decoded_token": "."}},
    ]  # fmt: skip
    legacy = responses.completion_logprobs(entries, 2, 5)
    assert legacy == {
        "tokens": ["h", "!"],
        "token_logprobs": [-0.1, -2.5],
        "top_logprobs": [{"h": -0.1, "i": -3.0}, {".": -0.5, "!": -2.5}],
        "text_offset": [5, 6],
    }
    chat = responses.chat_logprobs(entries, 1)["content"]
    assert [(c["token"], c["bytes"], [t["token"] for t in c["top_logprobs"]]) for c in chat] == [
        ("h", [104], ["h"]),
        ("!", [33], ["."]),
    ]


def test_stream_chunks_are_whole_json_events() -> None:
    head = responses.Head("cmpl-1", 7, "g", "completion")
    item = responses.completion_choice(0, "hé", None, None)
    plain = responses.chunk(head, [item], None, False)
    assert plain.startswith(b"data: ") and plain.endswith(b"\n\n")
    assert json.loads(plain[6:]) == {**head.object(True), "choices": [item]}
    with_usage = json.loads(responses.chunk(head, [item], None, True)[6:])
    assert with_usage["usage"] is None and with_usage["choices"] == [item]
    last = json.loads(responses.chunk(head, [], responses.usage(2, 3), True)[6:])
    assert (last["choices"], last["usage"]["total_tokens"]) == ([], 5)
    assert json.loads(responses.chunk(head, [], None, False)[6:])["choices"] == []
    chat = responses.Head("chatcmpl-1", 7, "g", "chat")
    assert json.loads(responses.chunk(chat, [], None, False)[6:])["object"] == (
        "chat.completion.chunk"
    )
