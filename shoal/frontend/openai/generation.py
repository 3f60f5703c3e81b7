"""One choice of an OpenAI request as a request to a generative model, and the model's
responses read back (pure: no sockets, no clock).

``model_request`` writes the contract's inputs (those the model declares):
``text_input``, ``stream``, ``sampling_parameters`` (JSON), ``exclude_input_in_output``
(true) and the ``return_*`` flags of the outputs it has. ``read_piece`` reads one
response's outputs; ``ChoiceText`` keeps a choice's text as it grows: UTF-8 decoded
across responses (a token may end inside a character), cut at the first stop string
(text that may begin one is held back until it cannot), its token counts and finish
reason.
"""

from __future__ import annotations

import codecs
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from shoal.dataplane.types import ClientRequest, InferenceResult, InputTensor
from shoal.frontend.openai.generative import TEXT_INPUT, TEXT_OUTPUT, GenerativeModel

#: The optional outputs the API reads, each enabled by its ``return_<name>`` input.
EXTRA_OUTPUTS: Final = ("finish_reason", "logprobs", "num_input_tokens", "num_output_tokens")


def bytes_tensor(values: list[bytes]) -> bytes:
    """BYTES elements in wire layout: each a 4-byte little-endian length, then itself.
    (These tensors hold one element or few: shoal.ipc.bytes_tensors' numpy walk, made
    for millions, costs some 15 us a call where this costs under one, once per token.)"""
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


def _elements(data: memoryview) -> list[bytes]:
    out, pos, end = [], 0, len(data)
    while pos + 4 <= end:
        (n,) = struct.unpack_from("<I", data, pos)
        out.append(bytes(data[pos + 4 : pos + 4 + n]))
        pos += 4 + n
    return out


def _input(model: GenerativeModel, name: str, datatype: str, data: bytes) -> InputTensor:
    spec = model.handle.inputs[name]
    shape = [1 if d < 0 else d for d in spec.dims] or [1]
    if model.handle.max_batch_size > 0:
        shape = [1, *shape]
    return InputTensor(name, datatype, shape, memoryview(data))


def model_request(
    model: GenerativeModel,
    prompt: str,
    sampling: dict[str, Any],
    stream: bool,
    want: tuple[str, ...],
    request_id: str,
) -> ClientRequest:
    """The request for one choice: ``sampling`` as the model's ``sampling_parameters``
    (when it has that input), ``want``: the extra outputs to enable (of those it has)."""
    inputs = [_input(model, TEXT_INPUT, "BYTES", bytes_tensor([prompt.encode()]))]
    flags = {"stream": stream, "exclude_input_in_output": True}
    flags |= {f"return_{name}": True for name in want if model.has_output(name)}
    for name, value in flags.items():
        if model.has_input(name):
            inputs.append(_input(model, name, "BOOL", b"\x01" if value else b"\x00"))
    if model.has_input("sampling_parameters"):
        blob = json.dumps(sampling, separators=(",", ":")).encode()
        inputs.append(_input(model, "sampling_parameters", "BYTES", bytes_tensor([blob])))
    return ClientRequest(model=model.name, version=str(model.handle.version), id=request_id,
                         inputs=inputs)  # fmt: skip


@dataclass
class Piece:
    """What one response carries: new text (bytes: may end inside a character) and the
    enabled extras it sent."""

    text: bytes = b""
    finish_reason: str | None = None
    logprobs: list[dict[str, Any]] | None = None
    num_input_tokens: int | None = None
    num_output_tokens: int | None = None


def read_piece(result: InferenceResult) -> Piece:
    """A response's outputs (a malformed ``logprobs`` JSON is ignored, as an absent one)."""
    piece = Piece()
    for out in result.outputs:
        if out.data is None:
            continue
        if out.name == TEXT_OUTPUT:
            piece.text = b"".join(_elements(out.data))
        elif out.name == "finish_reason" and (values := _elements(out.data)):
            piece.finish_reason = values[0].decode(errors="replace") or None
        elif out.name == "logprobs" and (values := _elements(out.data)):
            try:
                doc = json.loads(values[0])
            except ValueError:
                continue
            piece.logprobs = doc if isinstance(doc, list) else None
        elif out.name in ("num_input_tokens", "num_output_tokens") and len(out.data) >= 4:
            setattr(piece, out.name, struct.unpack_from("<I", out.data, 0)[0])
    return piece


class StopScanner:
    """Cuts text at the first of ``stops``; holds back a tail that could begin one."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self._longest = max((len(s) for s in self.stops), default=0)

    def feed(self, text: str) -> tuple[str, bool]:
        """The text that may go out now, and whether a stop string was reached (then the
        text is what came before it, and nothing more will go out)."""
        if not self.stops:
            return text, False
        buf = self._held + text
        cut = min((i for s in self.stops if (i := buf.find(s)) >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            return buf[:cut], True
        keep = 0
        for k in range(min(self._longest - 1, len(buf)), 0, -1):
            if any(s.startswith(buf[-k:]) for s in self.stops):
                keep = k
                break
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


@dataclass
class ChoiceText:
    """One choice as it grows. ``max_tokens``: the limit asked for (None: the model's),
    for the finish reason of a model that does not send its own. Not thread-safe: one
    coroutine feeds it."""

    index: int
    stops: StopScanner
    max_tokens: int | None
    text: str = ""
    tokens_seen: int = 0  # the model's count of generated tokens, when it sends one
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    count: Callable[[str], int] | None = None  # the tokenizer's count of a text
    # the prompt, when the model may repeat it first (it has no exclude_input_in_output
    # input: the contract's default is to include it): taken off the text's start
    echoed: bytes = b""
    _head: bytes = b""  # the text's first bytes, held while they may be ``echoed``
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def add(self, piece: Piece, final: bool) -> tuple[str, list[dict[str, Any]]]:
        """Take one response: the text (and logprob entries) to send for it."""
        if self.done:
            return "", []
        if piece.num_input_tokens is not None:
            self.prompt_tokens = piece.num_input_tokens
        if piece.num_output_tokens is not None:
            self.tokens_seen = piece.num_output_tokens
        raw = self._without_echo(piece.text, final)
        new, stopped = self.stops.feed(self._decoder.decode(raw, final=final))
        # a model that said it reached the limit, yet goes on: the limit holds here
        over = self.max_tokens is not None and self.tokens_seen >= self.max_tokens
        if (final or over) and not stopped:
            new += self.stops.flush()
        self.text += new
        entries = piece.logprobs or []
        self.logprobs.extend(entries)
        if stopped:
            self.finish_reason = "stop"
        elif final or over:
            self.finish_reason = self._final_reason(piece.finish_reason)
        return new, entries

    def _without_echo(self, raw: bytes, final: bool) -> bytes:
        if not self.echoed:
            return raw
        head = self._head + raw
        if self.echoed.startswith(head) and len(head) < len(self.echoed) and not final:
            self._head = head  # all of it may still be the prompt
            return b""
        echoed, self.echoed, self._head = self.echoed, b"", b""
        return head[len(echoed) :] if head.startswith(echoed) else head

    def completion_tokens(self) -> int:
        """The model's count of the tokens it generated, else the tokenizer's count of
        the text (``count``), else 0."""
        if self.tokens_seen or self.count is None:
            return self.tokens_seen
        return self.count(self.text)

    def _final_reason(self, said: str | None) -> str:
        if said in ("stop", "length"):
            return said
        if self.max_tokens is not None and self.completion_tokens() >= self.max_tokens:
            return "length"
        return "stop"
