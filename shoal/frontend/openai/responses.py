"""The response objects of OpenAI's completions and chat completions, whole and as
stream chunks (pure: the caller passes the id and the time).

A model's ``logprobs`` output (one JSON list per response: one entry per new token, a
map from token id to ``{"logprob", "rank", "decoded_token"}`` whose first key is the
token chosen, the others its alternatives; the most likely of all are the top ones)
becomes OpenAI's two forms: the legacy one
of completions (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``) and
chat's ``content`` list.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from shoal.dataplane.plane import SERVER_VERSION

SYSTEM_FINGERPRINT: Final = f"fp_shoal_{SERVER_VERSION}"

Kind = Literal["completion", "chat"]


@dataclass(frozen=True)
class Head:
    """What every object of one request repeats."""

    id: str
    created: int
    model: str
    kind: Kind

    @functools.cached_property
    def chunk_prefix(self) -> bytes:
        """``data: {"id":...,"choices":[``: every stream chunk's start."""
        return b"data: " + msgspec.json.encode(self.object(True))[:-1] + b',"choices":['

    def object(self, chunk: bool) -> dict[str, Any]:
        if self.kind == "completion":
            name = "text_completion"
        else:
            name = "chat.completion.chunk" if chunk else "chat.completion"
        return {
            "id": self.id,
            "object": name,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _tokens(entries: list[dict[str, Any]]) -> list[tuple[str, float, list[tuple[str, float]]]]:
    """Each entry as (chosen token, its logprob, [(token, logprob)] of all, most likely
    first)."""
    out = []
    for entry in entries:
        options = []
        for info in entry.values() if isinstance(entry, dict) else ():
            if isinstance(info, dict):
                token = str(info.get("decoded_token", ""))
                options.append((token, float(info.get("logprob", 0.0)), info.get("rank") or 0))
        if not options:
            continue
        chosen = options[0]
        ranked = sorted(options, key=lambda o: -o[1])  # (stable: ties keep their order)
        out.append((chosen[0], chosen[1], [(t, lp) for t, lp, _ in ranked]))
    return out


def completion_logprobs(entries: list[dict[str, Any]], top: int, offset: int) -> dict[str, Any]:
    """The legacy form; ``offset``: where the choice's text of these tokens begins."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for token, logprob, ranked in _tokens(entries):
        tokens.append(token)
        token_logprobs.append(logprob)
        tops.append(dict(ranked[:top]) if top else None)
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def chat_logprobs(entries: list[dict[str, Any]], top: int) -> dict[str, Any]:
    def item(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    content = [
        {**item(token, logprob), "top_logprobs": [item(t, lp) for t, lp in ranked[:top]]}
        for token, logprob, ranked in _tokens(entries)
    ]
    return {"content": content}


def completion_choice(
    index: int, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None
) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_choice(
    index: int, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "index": index,
        "message": {"role": "assistant", "content": text},
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }


def chat_delta(
    index: int,
    delta: dict[str, Any],
    finish_reason: str | None,
    logprobs: dict[str, Any] | None,
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


def whole(head: Head, choices: list[dict[str, Any]], use: dict[str, int]) -> dict[str, Any]:
    return {**head.object(False), "choices": choices, "usage": use}


def chunk(
    head: Head, choices: list[dict[str, Any]], use: dict[str, int] | None, with_usage: bool
) -> bytes:
    """A stream chunk as its server-sent event (``data: {...}``, then a blank line);
    with ``stream_options.include_usage`` every chunk has ``usage`` (null but in the
    last, which has no choices), as OpenAI sends them. What every chunk repeats is
    encoded once per request."""
    tail = b"]" if not with_usage else b'],"usage":' + msgspec.json.encode(use)
    items = msgspec.json.encode(choices)[1:-1]  # (the list's items, without its brackets)
    return b"".join((head.chunk_prefix, items, tail, b"}\n\n"))


def event(obj: dict[str, Any]) -> bytes:
    """Any object (an error) as a server-sent event."""
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"
