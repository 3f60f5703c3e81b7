"""The request bodies of OpenAI's completions and chat completions, as typed structs, and
OpenAI's error object.

A body is decoded once, by type (msgspec): a field of the wrong type or out of its range,
a field OpenAI does not define, or a missing required one is refused with OpenAI's 400
``invalid_request_error`` naming the field (``param``). Only the fields shoal acts on are
defined, with those clients commonly send as null or defaults (penalties, ``user``)
accepted and ignored.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, TypeVar

import msgspec
from msgspec import Meta

from shoal.ipc.errors import HTTP_STATUS, Code, ServingError

#: The most choices one request may ask for (``n`` times the prompts).
MAX_CHOICES: Final = 128
#: The most stop strings (OpenAI's limit).
MAX_STOP: Final = 4


class OpenAIError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param",
    "code"}}`` with HTTP status ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type_,
            param,
            code,
        )

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def from_serving(err: ServingError) -> OpenAIError:
    """A data-plane error (Triton's code) as OpenAI's: the same HTTP status, a client's
    error as ``invalid_request_error``, the server's (5xx) as ``server_error``."""
    status = HTTP_STATUS[err.code]
    if err.code == Code.UNAVAILABLE:
        return OpenAIError(status, err.message, "service_unavailable")
    return OpenAIError(
        status, err.message, "server_error" if status >= 500 else "invalid_request_error"
    )


def model_not_found(name: str) -> OpenAIError:
    """OpenAI's words and code for a model it does not serve."""
    return OpenAIError(
        404,
        f"The model `{name}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool = False


class ContentPart(msgspec.Struct):
    """One part of a message's content; only text parts are read."""

    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct):
    """A message as chat templates read it (other keys a client sends, such as
    ``tool_calls``, are ignored)."""

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


Temperature = Annotated[float, Meta(ge=0, le=2)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]


class _Sampling(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The fields both endpoints share."""

    model: str
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Temperature | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None  # (vLLM's: -1 or 0, no limit)
    n: Annotated[int, Meta(ge=1, le=MAX_CHOICES)] = 1
    stop: str | Annotated[list[str], Meta(max_length=MAX_STOP)] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # (vLLM's extension)
    # Passed to the model's sampling_parameters (as vLLM's SamplingParams reads them).
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    user: str | None = None


class CompletionRequest(_Sampling, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/completions``. ``prompt``: a string, a list of strings (one choice set
    each), or token ids (a list, or a list of lists) where the model has a tokenizer."""

    prompt: str | list[str | int | list[int]]
    echo: bool = False
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None
    suffix: str | None = None
    best_of: int | None = None
    logit_bias: dict[str, float] | None = None


class ChatCompletionRequest(_Sampling, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/chat/completions``. ``max_completion_tokens`` is the newer name of
    ``max_tokens``; when both are given it wins."""

    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_completion_tokens: Annotated[int, Meta(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    logit_bias: dict[str, float] | None = None


R = TypeVar("R", CompletionRequest, ChatCompletionRequest)

_AT = re.compile(r" - at `\$\.?([^`]*)`$")
_UNKNOWN = re.compile(r"^Object contains unknown field `([^`]*)`")
_MISSING = re.compile(r"^Object missing required field `([^`]*)`")


def decode(body: bytes, kind: type[R]) -> R:
    """The request ``body`` holds, or OpenAI's 400 naming the field that is wrong."""
    if not body:
        raise OpenAIError(400, "We could not parse the JSON body of your request: it is empty.")
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise _invalid(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise OpenAIError(400, f"We could not parse the JSON body of your request: {exc}") from None


def _invalid(text: str) -> OpenAIError:
    """msgspec's message (``Expected ... - at `$.field```) as OpenAI's error."""
    at = _AT.search(text)
    where = at.group(1) if at else ""
    head = text[: at.start()] if at else text
    if (m := _UNKNOWN.match(head)) is not None:
        name = f"{where}.{m.group(1)}" if where else m.group(1)
        return OpenAIError(400, f"Unrecognized request argument supplied: {name}", param=name)
    if (m := _MISSING.match(head)) is not None:
        name = f"{where}.{m.group(1)}" if where else m.group(1)
        return OpenAIError(400, f"Missing required parameter: '{name}'.", param=name)
    param = where.split("[", 1)[0] or None
    return OpenAIError(400, f"Invalid value for '{where}': {head}", param=param)


def invalid(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, message, param=param)
