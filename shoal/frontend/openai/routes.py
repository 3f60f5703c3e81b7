"""The OpenAI-compatible API over HTTP: ``GET /v1/models[/{model}]``,
``POST /v1/completions`` and ``POST /v1/chat/completions``, served on the HTTP port
beside Triton's ``/v2`` routes by every frontend process (docs/openai-api.md).

A thin shell: bodies are decoded by ``protocol``, planned by ``plan``, run by ``runs``
and answered with ``responses``' objects; streams are server-sent events
(``data: {...}`` per chunk, then ``data: [DONE]``). Every error is OpenAI's shape. A
failure before the first chunk is a plain error answer with its status; after it, one
``data: {"error": ...}`` event ends the stream. A client that goes away cancels the
handler, and with it the model's requests.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from shoal.dataplane.plane import DataPlane
from shoal.dataplane.types import FINAL_FLAG, InferenceResult, ResponseError
from shoal.frontend.http_body import read_body
from shoal.frontend.openai import responses
from shoal.frontend.openai.generation import (
    ChoiceText,
    Piece,
    StopScanner,
    model_request,
    read_piece,
)
from shoal.frontend.openai.generative import GenerativeModel, GenerativeModels
from shoal.frontend.openai.plan import Plan, chat_plan, completion_plan
from shoal.frontend.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIError,
    decode,
    from_serving,
    model_not_found,
)
from shoal.frontend.openai.runs import ChoiceRuns
from shoal.ipc.errors import HTTP_STATUS, ServingError

log = logging.getLogger("shoal.frontend.openai")

GENERATIVE: web.AppKey[GenerativeModels] = web.AppKey("generative_models", GenerativeModels)
OWNED_BY = "shoal"
_SSE_DONE = b"data: [DONE]\n\n"
_RNG = random.Random()
#: Texts longer than this are counted by the tokenizer in a thread (about a millisecond).
_COUNT_IN_THREAD_CHARS = 4 * 1024

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _answer(status: int, obj: object) -> web.Response:
    return web.Response(
        body=msgspec.json.encode(obj), status=status, content_type="application/json"
    )


def _openai_errors(handler: Handler) -> Handler:
    """Errors as OpenAI's object (the server's middleware would write Triton's)."""

    @functools.wraps(handler)
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except OpenAIError as err:
            return _answer(err.status, err.body())
        except ServingError as err:
            e = from_serving(err)
            return _answer(e.status, e.body())
        except web.HTTPRequestEntityTooLarge:
            return _answer(413, OpenAIError(413, "the request body is too large").body())

    return wrapped


def _models(request: web.Request) -> GenerativeModels:
    return request.app[GENERATIVE]


def _card(model: GenerativeModel) -> dict[str, Any]:
    return {"id": model.name, "object": "model", "created": model.created, "owned_by": OWNED_BY}


@_openai_errors
async def list_models(request: web.Request) -> web.StreamResponse:
    cards = [_card(m) for m in await _models(request).listed()]
    return _answer(200, {"object": "list", "data": cards})


@_openai_errors
async def get_model(request: web.Request) -> web.StreamResponse:
    return _answer(200, _card(await _served(request, request.match_info["model"])))


async def _served(request: web.Request, name: str) -> GenerativeModel:
    model = await _models(request).get(name)
    if model is None:
        raise model_not_found(name)
    return model


@_openai_errors
async def completions(request: web.Request) -> web.StreamResponse:
    req = decode(await read_body(request), CompletionRequest)
    model = await _served(request, req.model)
    plan = completion_plan(req, model, _RNG)
    head = responses.Head(f"cmpl-{uuid.uuid4().hex}", int(time.time()), req.model, "completion")
    return await _Answer(request, model, plan, head).run()


@_openai_errors
async def chat_completions(request: web.Request) -> web.StreamResponse:
    req = decode(await read_body(request), ChatCompletionRequest)
    model = await _served(request, req.model)
    plan = chat_plan(req, model, _RNG)
    head = responses.Head(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), req.model, "chat")
    return await _Answer(request, model, plan, head).run()


class _Answer:
    """One request's choices, run and answered whole or as a stream."""

    def __init__(
        self, request: web.Request, model: GenerativeModel, plan: Plan, head: responses.Head
    ) -> None:
        self.request, self.model, self.plan, self.head = request, model, plan, head
        tok = model.tokenizer
        count = None if tok is None else (lambda s: len(tok.encode(s, add_special_tokens=False)))
        echoes = not model.has_input("exclude_input_in_output")
        self.choices = [
            ChoiceText(i, StopScanner(plan.stops), plan.max_tokens, count=count,
                       echoed=plan.prompt_of(i).encode() if echoes else b"")
            for i in range(len(plan.sampling))
        ]  # fmt: skip
        # per choice: whether its first chunk went out, the characters sent so far
        self.started = [False] * len(self.choices)
        self.sent = [0] * len(self.choices)
        self.stream: web.StreamResponse | None = None

    async def run(self) -> web.StreamResponse:
        """The answer; a failure after the stream began is its last event, never an
        answer left open (a client that went away is not written to)."""
        try:
            return await self._run()
        except ConnectionError:
            raise
        except (OpenAIError, ServingError) as err:
            if self.stream is None:
                raise
            return await self._fail(err if isinstance(err, OpenAIError) else from_serving(err))
        except Exception as exc:
            log.exception("unhandled error answering %s", self.head.id)
            message = f"internal error: {type(exc).__name__}: {exc}"
            return await self._fail(OpenAIError(500, message, "server_error"))

    async def _run(self) -> web.StreamResponse:
        p = self.plan
        rid = self.head.id
        reqs = [
            model_request(self.model, p.prompt_of(i), s, p.stream, p.want, f"{rid}-{i}")
            for i, s in enumerate(p.sampling)
        ]
        dp: DataPlane = self.request.app[GENERATIVE].dataplane
        open_ = set(range(len(reqs)))
        async with ChoiceRuns(dp, reqs) as runs:
            while open_:
                index, event = await runs.next()
                if index not in open_:
                    if isinstance(event, InferenceResult):
                        event.release()
                    continue
                failure = await self._take(index, event)
                if failure is not None:
                    return await self._fail(failure)
                if self.choices[index].done:
                    open_.discard(index)
                    runs.stop(index)
        return await self._finish()

    async def _take(self, index: int, event: Any) -> OpenAIError | None:
        """One event of choice ``index``: its text taken (and streamed); an error is
        returned."""
        if isinstance(event, ServingError):
            return from_serving(event)
        if isinstance(event, ResponseError):
            return OpenAIError(HTTP_STATUS[event.code], event.message, "server_error")
        choice = self.choices[index]
        if event is None:  # the stream ended (its final flag came alone)
            text, entries = choice.add(Piece(), True)
        else:
            try:
                piece = read_piece(event)
                final = event.parameters.get(FINAL_FLAG) is True
            finally:
                event.release()
            text, entries = choice.add(piece, final)
        if self.plan.stream and (text or entries or choice.done):
            await self._send_delta(choice, text, entries)
        return None

    def _echo(self, choice: ChoiceText) -> str:
        return self.plan.prompt_of(choice.index) if self.plan.echo else ""

    def _logprobs(self, entries: list[dict[str, Any]], offset: int) -> dict[str, Any] | None:
        top = self.plan.top_logprobs
        if top is None:
            return None
        if self.head.kind == "completion":
            return responses.completion_logprobs(entries, top, offset)
        return responses.chat_logprobs(entries, top)

    async def _send_delta(
        self, choice: ChoiceText, text: str, entries: list[dict[str, Any]]
    ) -> None:
        if self.stream is None:
            await self._open_stream()
        i = choice.index
        prefix = "" if self.started[i] else self._echo(choice)
        self.started[i] = True
        offset = self.sent[i] + len(prefix)
        text = prefix + text
        self.sent[i] += len(text)
        logprobs = self._logprobs(entries, offset)
        if self.head.kind == "completion":
            item = responses.completion_choice(i, text, choice.finish_reason, logprobs)
        else:
            item = responses.chat_delta(i, {"content": text}, choice.finish_reason, logprobs)
        await self._event(responses.chunk(self.head, [item], None, self.plan.include_usage))

    async def _open_stream(self) -> None:
        resp = web.StreamResponse(status=200)
        resp.content_type = "text/event-stream"
        resp.charset = "utf-8"
        resp.headers["Cache-Control"] = "no-cache"
        await resp.prepare(self.request)
        self.stream = resp
        if self.head.kind == "chat":  # each choice's first chunk names its role
            for i in range(len(self.choices)):
                delta = {"role": "assistant", "content": ""}
                item = responses.chat_delta(i, delta, None, None)
                await self._event(responses.chunk(self.head, [item], None, self.plan.include_usage))

    async def _event(self, data: bytes) -> None:
        assert self.stream is not None
        await self.stream.write(data)

    async def _usage(self) -> dict[str, int]:
        """The request's token counts. Where the tokenizer counts (the model sent no
        counts) a long text, it counts in a thread: the event loop serves the others."""
        if self.model.tokenizer is None:
            return self._counted()
        size = sum(map(len, self.plan.prompts)) + sum(len(c.text) for c in self.choices)
        if size < _COUNT_IN_THREAD_CHARS:
            return self._counted()
        return await asyncio.to_thread(self._counted)

    def _counted(self) -> dict[str, int]:
        tok = self.model.tokenizer
        prompt_tokens = 0
        for p, prompt in enumerate(self.plan.prompts):
            counted = self.choices[p * self.plan.n].prompt_tokens
            if counted is None and tok is not None:
                counted = len(tok.encode(prompt).ids)
            prompt_tokens += counted or 0
        completion = sum(c.completion_tokens() for c in self.choices)
        return responses.usage(prompt_tokens, completion)

    async def _finish(self) -> web.StreamResponse:
        if self.plan.stream:
            if self.stream is None:
                await self._open_stream()
            if self.plan.include_usage:
                await self._event(responses.chunk(self.head, [], await self._usage(), True))
            assert self.stream is not None
            await self.stream.write(_SSE_DONE)
            await self.stream.write_eof()
            return self.stream
        items = []
        for c in self.choices:
            text = self._echo(c) + c.text
            lp = self._logprobs(c.logprobs, len(self._echo(c)))
            make = (
                responses.completion_choice
                if self.head.kind == "completion"
                else responses.chat_choice
            )
            items.append(make(c.index, text, c.finish_reason, lp))
        return _answer(200, responses.whole(self.head, items, await self._usage()))

    async def _fail(self, err: OpenAIError) -> web.StreamResponse:
        if self.stream is None:
            return _answer(err.status, err.body())
        await self._event(responses.event(err.body()))
        await self.stream.write(_SSE_DONE)
        await self.stream.write_eof()
        return self.stream


def routes() -> list[web.RouteDef]:
    return [
        web.get("/v1/models", list_models),
        web.get("/v1/models/{model:.+}", get_model),
        web.post("/v1/completions", completions),
        web.post("/v1/chat/completions", chat_completions),
    ]
