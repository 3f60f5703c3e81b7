"""A gRPC stream (ModelStreamInfer): its requests run concurrently; as Triton's stream
handler writes them, the answers to models that are not decoupled go out in the order
the stream brought their requests, and a decoupled model's responses as they come. An
error is an ``error_message`` on the stream and the stream goes on, unless the stream
was opened with Triton's ``triton_grpc_error: true`` header: then a model's error
response (not a refusal of a request before it ran, which stays on the stream, as in
Triton) ends the stream with the error's gRPC status, and the stream's other requests
are cancelled. A message that does not parse (``Unparsable``, the guarded
deserializer's, shoal/frontend/grpc_server.py) ends the stream with INTERNAL "Unable to
parse request" once the requests before it are answered.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Final

import grpc
from tritonclient.grpc import service_pb2 as pb

from shoal.dataplane.plane import DataPlane
from shoal.dataplane.tracing import Trace
from shoal.dataplane.types import FINAL_FLAG, ClientRequest, InferenceResult, ResponseError
from shoal.frontend import grpc_codec
from shoal.ipc.errors import GRPC_STATUS, AnswerError, Code, ServingError

log = logging.getLogger("shoal.frontend.grpc")

STREAM_WINDOW: Final[int] = 1024  # requests in flight on one stream before reading pauses
UNPARSABLE_MESSAGE: Final[str] = "Unable to parse request"
#: A request whose inputs carry more BYTES elements than this in typed contents
#: (``bytes_contents``) is decoded on a worker thread: packing millions of protobuf strings
#: takes long enough (seconds for 10 Mi) to stall every other client of the event loop.
DECODE_ON_THREAD_ELEMENTS: Final[int] = 64 * 1024
#: The service's answer to one request of a model that is not decoupled (tensors read;
#: its trace, if it is sampled).
Infer = Callable[
    [pb.ModelInferRequest, ClientRequest, Trace | None], Awaitable[pb.ModelInferResponse]
]


class Unparsable:
    """What a guarded deserializer gives for bytes it cannot parse."""

    __slots__ = ("method", "reason")

    def __init__(self, method: str, reason: str) -> None:
        self.method = method
        self.reason = reason

    def log(self) -> None:
        log.warning("%s: %s (%s)", self.method, UNPARSABLE_MESSAGE, self.reason)


#: A stream's answer: a response to send (or None), whether it is its request's last, the
#: code of the error it carries, where it is a model's error response, and its request's
#: trace (sampled: its sends are stamped, and it is finished with its last answer).
_Answer = tuple[pb.ModelStreamInferResponse | None, bool, Code | None, Trace | None]
#: A request's answer to a model that is not decoupled, its error response's code, and
#: its request's trace.
_Ordered = tuple[pb.ModelStreamInferResponse, Code | None, Trace | None]
#: The header that asks a stream to end with a model's first error response.
GRPC_ERROR_HEADER: Final[str] = "triton_grpc_error"


def ends_on_error(metadata: Any) -> bool:
    """Whether a stream's client asked, with ``triton_grpc_error: true``, that a model's
    error response end it with its gRPC status (Triton's exact value, "true")."""
    return any(k == GRPC_ERROR_HEADER and v == "true" for k, v in metadata or ())


async def decode_request(request: pb.ModelInferRequest) -> ClientRequest:
    """``grpc_codec.decode_infer_request``, on a worker thread for a request with many
    BYTES elements (DECODE_ON_THREAD_ELEMENTS), so the event loop serves others
    meanwhile; the protobuf message is only read there, and nothing else touches it."""
    elements = sum(len(t.contents.bytes_contents) for t in request.inputs)
    if elements <= DECODE_ON_THREAD_ELEMENTS:
        return grpc_codec.decode_infer_request(request)
    return await asyncio.to_thread(grpc_codec.decode_infer_request, request)


def _stream_error(request: pb.ModelInferRequest, exc: Exception) -> pb.ModelStreamInferResponse:
    """A stream request's error as its answer. The id rides along so a client with many
    requests in flight can match it; nothing else, as Triton 2.51 answers (triton-peer)."""
    if isinstance(exc, ServingError):
        message = exc.message
    else:
        log.exception("unhandled error in a stream request", exc_info=exc)
        message = internal(exc)
    return pb.ModelStreamInferResponse(
        error_message=message, infer_response=pb.ModelInferResponse(id=request.id)
    )


def _stream_answer(
    request: pb.ModelInferRequest, r: InferenceResult | ResponseError
) -> pb.ModelStreamInferResponse:
    """One response of a decoupled model on a stream. A model's error response names
    the model and says whether it is the last, as Triton 2.51's does."""
    if isinstance(r, ResponseError):
        failed = pb.ModelInferResponse(id=request.id, model_name=request.model_name)
        grpc_codec.set_param(failed.parameters[FINAL_FLAG], r.final)
        return pb.ModelStreamInferResponse(error_message=r.message, infer_response=failed)
    try:
        return pb.ModelStreamInferResponse(infer_response=grpc_codec.encode_infer_response(r))
    finally:
        r.release()


def internal(exc: Exception) -> str:
    """An unexpected exception, as its client is told of it."""
    return f"internal error: {type(exc).__name__}: {exc}"


async def _stream_one(
    infer: Infer, request: pb.ModelInferRequest, decoded: ClientRequest, trace: Trace | None
) -> _Ordered:
    """One request of a stream: its error is its own answer (with its code where the
    model's answer carried it)."""
    try:
        answer = await infer(request, decoded, trace)
    except AnswerError as exc:
        return _stream_error(request, exc), exc.code, trace
    except Exception as exc:
        return _stream_error(request, exc), None, trace
    if trace is not None:
        trace.stamp("INFER_RESPONSE_COMPLETE")
    grpc_codec.set_param(answer.parameters[FINAL_FLAG], True)  # as Triton 2.51's
    return pb.ModelStreamInferResponse(infer_response=answer), None, trace


async def _stream_decoupled(
    dp: DataPlane,
    request: pb.ModelInferRequest,
    decoded: ClientRequest,
    answers: asyncio.Queue[_Answer | None],
) -> None:
    """One request of a stream to a decoupled model: each of its responses goes out
    as it comes (an error among them too); the last one releases its window place. A
    traced request's first response is stamped INFER_RESPONSE_COMPLETE, as Triton's."""
    trace = decoded.trace
    try:
        responses = dp.infer_stream(decoded)
        async with contextlib.aclosing(responses) as answered:  # (its end cancels)
            async for r in answered:
                if trace is not None and trace.responses == 0:
                    trace.stamp("INFER_RESPONSE_COMPLETE")
                if trace is not None:
                    trace.responses += 1
                code = r.code if isinstance(r, ResponseError) else None
                answers.put_nowait((_stream_answer(request, r), False, code, trace))
    except Exception as exc:
        answers.put_nowait((_stream_error(request, exc), True, None, trace))
        return
    answers.put_nowait((None, True, None, trace))


async def serve(
    dp: DataPlane,
    infer: Infer,
    request_iterator: AsyncIterator[pb.ModelInferRequest],
    context: Any,
    traceparent: str = "",
) -> AsyncGenerator[pb.ModelStreamInferResponse, None]:
    """A stream's answers (``infer``: the service's one request to a model that is not
    decoupled, with its tensors read already). While tracing is on, each request is
    sampled (``traceparent``: the stream's trace context, each request's parent); a
    traced request's answers are stamped GRPC_SEND_START/END as they go out, in their
    turn, and its trace is finished with its last. Requests run concurrently. As Triton's
    stream handler writes them, the answers of requests to models that are not
    decoupled (and the errors of requests that failed before reaching one) go out in
    the order the stream brought the requests,
    each once those before it went; a decoupled model's responses go out as they
    come. At most STREAM_WINDOW requests are running or answered but not yet sent;
    past that, reading pauses."""
    # (a response to send, or None; whether its request is done with) ... None: the end
    answers: asyncio.Queue[_Answer | None] = asyncio.Queue()
    window = asyncio.Semaphore(STREAM_WINDOW)
    running: set[asyncio.Task[None]] = set()
    unparsable: list[Unparsable] = []
    # the ordered answers' places, in stream order: each filled when ready
    ordered: collections.deque[list[_Ordered | None]] = collections.deque()
    end_on_error = ends_on_error(context.invocation_metadata())

    def give(place: list[_Ordered | None], answer: _Ordered) -> None:
        """``answer`` takes its place; the ready answers at the front go out."""
        place[0] = answer
        while ordered and (ready := ordered[0][0]) is not None:
            ordered.popleft()
            answers.put_nowait((ready[0], True, ready[1], ready[2]))

    async def answer(
        request: pb.ModelInferRequest, before: asyncio.Event | None, handed: asyncio.Event
    ) -> None:
        """The requests reach the broker in the order the stream brought them, as
        Triton reads a stream into its scheduler (preserve_ordering then answers in
        that order). A request's one wait before it leaves is the lookup of a model
        this frontend has not cached yet; the lookups run at once (a silent broker
        fails them together), then each request waits until the one before it has
        been handed over (``before``), and says so (``handed``) just before its own
        hand-over, which does not wait. A warm stream waits for nothing. A request
        with many BYTES elements is decoded on a thread (decode_request) before it
        waits for its turn, so that too keeps the order."""
        trace = None
        if dp.tracer.active and (trace := dp.tracer.sample(request.model_name, traceparent)):
            trace.stamp("GRPC_WAITREAD_START")
            trace.stamp("GRPC_WAITREAD_END")
        failed: Exception | None = None
        decoupled = False
        decoded: ClientRequest | None = None
        place: list[_Ordered | None] = [None]
        try:
            try:
                model = await dp.model(request.model_name, request.model_version)
                decoupled = model.decoupled
                decoded = await decode_request(request)
            except Exception as exc:  # the request's answer, in its turn
                failed = exc
            if before is not None:
                await before.wait()
            if failed is not None or not decoupled:
                ordered.append(place)  # in the stream's order: the turns are
        finally:
            handed.set()  # also when cancelled: the next ones must not wait for it
        if failed is not None:
            give(place, (_stream_error(request, failed), None, trace))
            return
        assert decoded is not None  # (read, as nothing failed)
        if decoupled:
            decoded.trace = trace
            await _stream_decoupled(dp, request, decoded, answers)
        else:
            give(place, await _stream_one(infer, request, decoded, trace))

    async def read() -> None:
        before: asyncio.Event | None = None
        try:
            async for request in request_iterator:
                if isinstance(request, Unparsable):
                    unparsable.append(request)
                    return  # what came before is answered; then the stream ends
                await window.acquire()
                handed = asyncio.Event()
                task = asyncio.create_task(answer(request, before, handed))
                before = handed
                running.add(task)
                task.add_done_callback(running.discard)
        finally:
            while running:  # the answers still to come go out before the end
                await asyncio.wait(set(running))
            answers.put_nowait(None)

    reader = asyncio.create_task(read())
    try:
        while (next_answer := await answers.get()) is not None:
            response, last, failure, trace = next_answer
            if failure is not None and end_on_error and response is not None:
                if trace is not None:
                    dp.tracer.finish(trace)
                status = getattr(grpc.StatusCode, GRPC_STATUS[failure])
                await context.abort(status, response.error_message)
            if response is not None:
                if trace is not None:
                    trace.stamp("GRPC_SEND_START")
                yield response
                if trace is not None:
                    trace.stamp("GRPC_SEND_END")
            if last:
                window.release()
                if trace is not None:
                    dp.tracer.finish(trace)
        if unparsable:
            unparsable[0].log()
            await context.abort(grpc.StatusCode.INTERNAL, UNPARSABLE_MESSAGE)
    finally:
        reader.cancel()
        for task in list(running):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
