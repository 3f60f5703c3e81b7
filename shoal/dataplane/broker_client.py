"""The frontend's asyncio connection to the broker and the workers.

One DEALER socket carries every request of this frontend process to the broker (and
brings back control-plane answers and the errors the broker itself produces); a unix
socket, listening in the runtime directory under this frontend's identity, receives
results straight from the workers, one connection per worker (shoal.ipc.result_link).
Answers are matched to waiting futures by id.

The DEALER is plain (not zmq.asyncio): the event loop watches its ZMQ_FD and a
callback drains it, which costs one callback per wake-up instead of a future per
message. ZMQ_FD is edge-triggered, so every drain reads until nothing is left, and a
send on the DEALER re-checks for input it may have absorbed. The result connections
are read by the event loop directly, one read per wake-up.

Requests leave in groups: those that reach ``infer`` in one turn of the event loop go
in one message (``shoal.ipc.messages`` framing), sent at the end of the turn, and a worker
sends the answers of one batch to this frontend in one message too. Each message wakes
the broker (and the ZeroMQ I/O threads on its way) once, and a wake-up is what a hop
costs most on a small host. Waiting for the turn's end costs a lone request one pass of
the loop (microseconds); a burst that reaches an idle server in one turn is batched as
one, even the first of it.

A worker that dies just after reporting a batch answered may take the answers with it;
the broker names those requests (``Unconfirmed``) and the ones still waiting here after a
short grace fail as the dead worker's other requests do.

The broker's pid (from its Welcome) is watched through a pidfd: when the broker dies,
every waiting request fails at once with UNAVAILABLE, and the client greets whichever
broker binds the endpoint next. The broker tells every frontend its table of client
shared-memory registrations whenever it changes; the hello to a new broker carries the
last one, so registrations outlive a broker restart. The other way, this frontend says
something at least every second or so (a ping when idle), from its event loop: a
frontend that falls silent is stuck, and the broker kills it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec
import zmq

from shoal.dataplane.hop_histogram import HopHistogram
from shoal.ipc import logs, sockets
from shoal.ipc import messages as m
from shoal.ipc.errors import Code, ServingError
from shoal.ipc.result_link import FrameReader, listen

log = logging.getLogger("shoal.frontend.broker")

_HELLO_RETRY_S = 0.5
#: A connected broker is pinged when it has said nothing for this long, or when this
#: frontend has said nothing for this long: the broker kills a frontend that stays silent
#: (shoal/broker/frontend_watch.py), and the ping, sent from the event loop, says it runs...
_PING_AFTER_S = 1.0
#: ...and given up on (as if it had exited) when it stays silent this long: stopped or
#: stuck, it would otherwise keep every request waiting. Its loop answers in
#: milliseconds even under load, so seconds of silence mean it is not running.
_SILENT_BROKER_S = 10.0
#: How long an answer a dead worker did send gets to arrive before the requests it may
#: not have answered are failed (it was written before the death the broker announces).
_UNCONFIRMED_GRACE_S = 0.25
#: How long closing waits for what was sent last to leave (a broker gone takes no more).
_CLOSE_LINGER_MS = 200
#: One read of a worker's result connection: a batch of answers at once.
_RESULT_READ_BYTES = 256 * 1024
T = TypeVar("T", bound=msgspec.Struct)
#: The legs of a request's way (InferRequest.hops, InferResponse.hops), in order: three
#: hops between processes and the time inside the broker and inside the worker.
HOPS: Final = (
    "frontend_to_broker",
    "in_broker",
    "broker_to_worker",
    "in_worker",
    "worker_to_frontend",
)


class ResponseStream:
    """A decoupled model's answers to one request, as they arrive, until its final one.
    It stands in the pending table where a Future stands for other requests (``done``,
    ``set_result``, ``set_exception``, ``add_done_callback``)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[m.InferResponse | BaseException] = asyncio.Queue()
        self._done = False
        self._callbacks: list[Callable[[ResponseStream], None]] = []

    def done(self) -> bool:
        return self._done

    def set_result(self, resp: msgspec.Struct) -> None:
        assert isinstance(resp, m.InferResponse)
        self.queue.put_nowait(resp)
        if resp.final:
            self._end()

    def set_exception(self, exc: BaseException) -> None:
        self.queue.put_nowait(exc)
        self._end()

    def add_done_callback(self, callback: Callable[[ResponseStream], None]) -> None:
        if self._done:
            callback(self)
        else:
            self._callbacks.append(callback)

    def _end(self) -> None:
        self._done = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)


def _late_answer(fut: asyncio.Future[Any]) -> m.InferResponse | None:
    """The answer an abandoned request's future holds, if it holds one."""
    if fut.cancelled() or fut.exception() is not None:
        return None
    resp = fut.result()
    return resp if isinstance(resp, m.InferResponse) else None


class BrokerClient:
    def __init__(self, runtime_dir: Path, index: int, summaries: bool = False) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.identity = sockets.frontend_identity(index)
        self.index = index
        self.runtime_dir = runtime_dir
        self.summaries = summaries  # it serves latency summaries: the broker keeps windows
        # Bound before the first hello, so a worker's first result always finds it.
        self._results_path = sockets.result_path(runtime_dir, self.identity)
        self.results = listen(self._results_path)
        # the workers' result connections (and what each has sent of an answer), by fd
        self._links: dict[int, tuple[socket.socket, FrameReader]] = {}
        self._read_buf = bytearray(_RESULT_READ_BYTES)
        self._broker_addr = sockets.endpoint(runtime_dir, sockets.FRONTEND_SOCKET)
        self.sock = sockets.dealer(self.ctx, self._broker_addr, self.identity)
        self.on_broker_lost: list[Callable[[], None]] = []
        # models loaded, reloaded or unloaded (model control): their names
        self.on_models_changed: list[Callable[[list[str]], None]] = []
        # the server's trace settings (in each Welcome, and again when they change)
        self.on_trace_table: list[Callable[[m.TraceTable], None]] = []
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[msgspec.Struct] | ResponseStream] = {}
        self._outbox: list[bytes] = []  # encoded requests of this turn, not sent yet
        self._notes: list[list[bytes]] = []  # one-way notes of this turn (notify), after them
        self._flush_due = False
        self._welcomed = asyncio.Event()
        self._broker_pidfd: int | None = None
        self._greeter: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_heard = 0.0  # monotonic time of the broker's last message
        self._last_sent = 0.0  # monotonic time of this frontend's last message to it
        self._closed = False
        self._leaving = False  # stopping on request (leaving)
        self.silent_broker_s = _SILENT_BROKER_S
        self.model_control = False  # the broker's model control mode is explicit
        # The broker's client shared-memory registrations (ClientRegionsKnown), kept
        # through a broker's loss: the next hello hands them to its successor.
        self.client_regions: list[m.ShmRequest] = []
        # SHOAL_HOP_TIMING=1: every request's way is stamped by each process; per leg
        # (HOPS), [requests, total ns] of the answers that came back stamped
        self.hop_timing = os.environ.get("SHOAL_HOP_TIMING", "") == "1"
        self.hops: dict[str, list[int]] = {leg: [0, 0] for leg in HOPS}
        self.hop_histogram = HopHistogram(HOPS)  # (/metrics: shoal_hop_duration_us)
        self.broker_pid = 0  # the welcoming broker's

    @property
    def waiting(self) -> int:
        """Requests and queries sent and not answered yet (abandoned ones included)."""
        return len(self._pending)

    @property
    def connected(self) -> bool:
        """Welcomed by a broker and not closed: only then may anything be sent."""
        return self._welcomed.is_set() and not self._closed

    def start(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        loop.add_reader(self.sock.FD, self._drain_broker)
        loop.add_reader(self.results.fileno(), self._accept_results)
        self._greeter = asyncio.create_task(self._greet(), name="broker-hello")
        # Anything that arrived before the readers were installed.
        loop.call_soon(self._drain_broker)

    async def wait_connected(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._welcomed.wait(), timeout)
        return self.connected

    def next_id(self) -> int:
        return next(self._ids)

    async def infer(
        self,
        req: m.InferRequest,
        on_abandoned: Callable[[], None],
        on_late: Callable[[m.InferResponse | None], None] | None = None,
    ) -> m.InferResponse:
        """Send one request; the answer may carry an error (never raises for it).

        If the caller is cancelled (a client's deadline, a closed stream) once the request
        is out, a worker may still read its inputs and write its outputs: the request
        stays pending, and ``on_abandoned`` runs only when its answer finally arrives (or
        the broker is lost), after ``on_late`` (given: that answer, None without one).
        Until then the caller must not reuse the request's memory.
        The broker is told, so a request still queued is answered (CANCELLED) at once
        rather than when it would have run, behind a slow or hung model.
        """
        if not self.connected:
            raise ServingError(Code.UNAVAILABLE, "Server is not ready: no broker connection")
        fut = self._expect(req.req_id)
        if self.hop_timing and not req.hops:  # (a traced request's are stamped already)
            req.hops = [time.monotonic_ns()]
        self._queue(m.encode_payload(req))
        try:
            # (awaited bare, not through asyncio.shield: a shield's own future and
            # callbacks cost more than half of this wait's CPU)
            resp = await fut
        except asyncio.CancelledError:
            if fut.cancelled():  # the caller's cancel reached it: the answer is yet to come
                fut = self._expect(req.req_id)  # and its arrival still ends the request
            if on_late is not None:
                fut.add_done_callback(lambda f: on_late(_late_answer(f)))
            fut.add_done_callback(lambda _: self._abandoned(req.req_id, on_abandoned))
            if not fut.done() and self.connected:
                self._send(m.encode(m.Cancel(req.req_id)))  # dropped if still queued
            raise
        except BaseException:
            self._pending.pop(req.req_id, None)
            raise
        self._pending.pop(req.req_id, None)
        assert isinstance(resp, m.InferResponse)
        return resp

    def open_stream(self, req: m.InferRequest) -> ResponseStream:
        """Send one request to a decoupled model: its answers arrive on the stream, the
        last with ``final`` (an error from the broker, or the broker lost, ends it too).
        The caller must ``close_stream`` it."""
        if not self.connected:
            raise ServingError(Code.UNAVAILABLE, "Server is not ready: no broker connection")
        stream = self._pending[req.req_id] = ResponseStream()
        self._queue(m.encode_payload(req))
        return stream

    def close_stream(
        self, req_id: int, stream: ResponseStream, on_abandoned: Callable[[], None]
    ) -> None:
        """The caller is done with ``stream``. One not ended yet (its client went away)
        is cancelled: the model may see it and stop; ``on_abandoned`` runs once it ends,
        as ``infer``'s does."""
        if stream.done():
            self._pending.pop(req_id, None)
            return
        stream.add_done_callback(lambda _: self._abandoned(req_id, on_abandoned))
        if self.connected:
            self._send(m.encode(m.Cancel(req_id)))

    def notify(self, msg: msgspec.Struct) -> None:
        """A one-way message to the broker, sent at the end of this turn of the loop after
        its requests (or before any message sent sooner); dropped without a broker."""
        if self.connected:
            self._notes.append(m.encode(msg))
            self._flush_soon()

    def _abandoned(self, req_id: int, on_abandoned: Callable[[], None]) -> None:
        self._pending.pop(req_id, None)
        on_abandoned()

    async def query(self, msg: msgspec.Struct, reply_type: type[T], timeout: float = 5.0) -> T:
        """A control-plane round trip (model info, server state)."""
        if not self.connected and not await self.wait_connected(min(timeout, 1.0)):
            raise ServingError(Code.UNAVAILABLE, "Server is not ready: no broker connection")
        qid: int = msg.query_id  # type: ignore[attr-defined]
        fut = self._expect(qid)
        try:
            self._send(m.encode(msg))
            reply = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise ServingError(Code.UNAVAILABLE, "broker did not answer in time") from None
        finally:
            self._pending.pop(qid, None)
        assert isinstance(reply, reply_type)
        return reply

    def _expect(self, key: int) -> asyncio.Future[msgspec.Struct]:
        assert self._loop is not None
        fut: asyncio.Future[msgspec.Struct] = self._loop.create_future()
        self._pending[key] = fut
        return fut

    def _queue(self, request: bytes) -> None:
        """Send an encoded InferRequest with the others of this turn of the loop."""
        self._outbox.append(request)
        self._flush_soon()

    def _flush_soon(self) -> None:
        if not self._flush_due:  # the first of this turn: the flush is due after it
            assert self._loop is not None
            self._loop.call_soon(self._flush)
            self._flush_due = True

    def _flush(self) -> None:
        self._flush_due = False
        if self._closed:
            return
        if self._outbox:
            frames = [m.KINDS[m.InferRequest], *self._outbox]
            self._outbox = []
            self._send_now(frames)
        notes, self._notes = self._notes, []
        for frames in notes:
            self._send_now(frames)

    def _send(self, frames: list[bytes]) -> None:
        self._flush()  # in order: a Cancel must not overtake the request it cancels
        self._send_now(frames)

    def _send_now(self, frames: list[bytes]) -> None:
        # The DEALER has no high-water mark, so a non-blocking send never fails with EAGAIN.
        sockets.send_frames(self.sock, frames, sockets.NOBLOCK)
        self._last_sent = time.monotonic()
        if sockets.readable(self.sock) and self._loop is not None:
            self._loop.call_soon(self._drain_broker)

    async def _greet(self) -> None:
        """Greet until welcomed; then keep the connected broker under watch: ping it when
        it is quiet, and give it up when it stays silent."""
        while True:
            if not self._welcomed.is_set():
                hello = m.FrontendHello(
                    os.getpid(), self.index, self.summaries, self.client_regions
                )
                self._send(m.encode(hello))
            else:
                now = time.monotonic()
                silent = now - self._last_heard
                if silent > self.silent_broker_s:
                    self._broker_lost(f"the server's broker did not answer for {silent:.0f}s")
                elif now - min(self._last_heard, self._last_sent) > _PING_AFTER_S:
                    self._send(m.encode(m.ServerQuery(self.next_id())))  # any answer will do
            await asyncio.sleep(_HELLO_RETRY_S)

    def _accept_results(self) -> None:
        """A worker connects to send its first answers to this frontend."""
        while not self._closed:
            try:
                conn, _ = self.results.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # (out of descriptors: the worker tries again)
                log.warning("a worker's result connection was refused: %s", exc)
                return
            conn.setblocking(False)
            link = self._links[conn.fileno()] = (conn, FrameReader())
            assert self._loop is not None
            self._loop.add_reader(conn.fileno(), self._read_results, *link)

    def _read_results(self, conn: socket.socket, reader: FrameReader) -> bool:
        """One read of a worker's connection (its answers, or its end); False when
        nothing was waiting."""
        try:
            n = conn.recv_into(self._read_buf)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            n = 0
        if n == 0:  # the worker closed it (exited, or gave this frontend up)
            self._drop_link(conn, reader)
            return False
        self._resolve_all(reader.feed(bytes(memoryview(self._read_buf)[:n])))
        return True

    def _drop_link(self, conn: socket.socket, reader: FrameReader) -> None:
        if reader.partial:
            log.error("a worker's connection ended inside an answer (%d bytes)", reader.partial)
        if self._links.pop(conn.fileno(), None) is not None and self._loop is not None:
            self._loop.remove_reader(conn.fileno())
        conn.close()

    def _drain_results(self) -> None:
        """Read every answer the workers' connections hold now."""
        for conn, reader in list(self._links.values()):
            while not self._closed and self._read_results(conn, reader):
                pass

    def _drain_broker(self) -> None:
        while not self._closed and sockets.readable(self.sock):
            frames = sockets.recv_frames(self.sock, sockets.NOBLOCK)
            self._last_heard = time.monotonic()
            try:
                self._dispatch(frames)
            except Exception as exc:  # one bad message must not stall the edge-triggered fd
                log.warning("dropped a malformed message from the broker: %s", exc)

    def _resolve_all(self, payloads: list[bytes] | list[memoryview]) -> None:
        for payload in payloads:
            try:
                resp = m.decode_response(payload)
            except ValueError as exc:  # the others must still reach their callers
                log.warning("dropped a malformed result: %s", exc)
                continue
            fut = self._pending.get(resp.req_id)
            if fut is not None and not fut.done():
                fut.set_result(resp)
            if resp.hops:  # measured (a traced request's: in its TracedAnswer)
                way = resp.hops
                hops = way if isinstance(way, list) else way.hops
                if len(hops) == len(HOPS):
                    self._count_hops([*hops, time.monotonic_ns()])

    def _trace_table(self, table: m.TraceTable) -> None:
        for callback in self.on_trace_table:
            callback(table)

    def _count_hops(self, stamps: list[int]) -> None:
        durations = [end - start for start, end in itertools.pairwise(stamps)]
        for leg, ns in zip(HOPS, durations, strict=False):
            totals = self.hops[leg]
            totals[0] += 1
            totals[1] += ns
        self.hop_histogram.observe(durations)

    def _dispatch(self, frames: list[bytes]) -> None:
        kind = frames[0]
        if kind == m.RESULT:
            self._resolve_all(frames[1:])
            return
        msg = m.decode(kind, frames[1])
        if isinstance(msg, m.Welcome):
            self._watch_broker(msg.broker_pid)
            if msg.log is not None:
                logs.apply(msg.log)
            self.model_control = msg.model_control
            if msg.trace is not None:
                self._trace_table(msg.trace)
            self._welcomed.set()
            if self._leaving:
                self._send(m.encode(m.FrontendLeaving()))
            return
        if isinstance(msg, m.LogSettings):
            logs.apply(msg)
            return
        if isinstance(msg, m.TraceTable):
            self._trace_table(msg)
            return
        if isinstance(msg, m.ClientRegionsKnown):
            self.client_regions = msg.regions
            return
        if isinstance(msg, m.ModelsChanged):
            for callback in self.on_models_changed:
                callback(msg.names)
            return
        if isinstance(msg, m.Unconfirmed):
            assert self._loop is not None
            self._loop.call_later(_UNCONFIRMED_GRACE_S, self._settle_unconfirmed, msg)
            return
        qid = getattr(msg, "query_id", None)
        fut = self._pending.get(qid) if qid is not None else None
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def _settle_unconfirmed(self, msg: m.Unconfirmed) -> None:
        """Fail the requests a dead worker reported answered whose answers never came."""
        self._drain_results()
        lost = 0
        for req_id in msg.req_ids:
            fut = self._pending.get(req_id)
            if fut is not None and not fut.done():
                fut.set_result(m.InferResponse(req_id, [], msg.error))
                lost += 1
        if lost:
            log.error("%d answer(s) died with their worker: %s", lost, msg.error.message)

    def _watch_broker(self, pid: int) -> None:
        self.broker_pid = pid
        self._unwatch()
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return
        self._broker_pidfd = fd
        asyncio.get_running_loop().add_reader(fd, self._broker_died)

    def _unwatch(self) -> None:
        if self._broker_pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._broker_pidfd)
            os.close(self._broker_pidfd)
            self._broker_pidfd = None

    def _broker_died(self) -> None:
        self._broker_lost("the server's broker process exited")

    def _broker_lost(self, reason: str) -> None:
        """The broker exited or went silent: fail every waiting request, and start over
        with whichever broker greets next (the same one, should a silent one wake up)."""
        log.error("%s; failing %d waiting request(s)", reason, len(self._pending))
        self._unwatch()
        self._welcomed.clear()
        self._outbox = []  # their callers are answered below; no broker may run them
        self._notes = []
        err = ServingError(Code.UNAVAILABLE, reason)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        # Requests still queued in the socket must not reach the next broker: their
        # callers have been answered. A fresh socket (linger 0) drops them.
        assert self._loop is not None
        self._loop.remove_reader(self.sock.FD)
        self.sock.close(0)
        self.sock = sockets.dealer(self.ctx, self._broker_addr, self.identity)
        self._loop.add_reader(self.sock.FD, self._drain_broker)
        for callback in self.on_broker_lost:
            callback()

    def leaving(self) -> None:
        """Tell the broker this frontend is stopping on request: the exit that follows
        is then logged as a stop, not as a frontend lost. Told again to a broker that
        welcomes it later (one restarted during the drain)."""
        self._leaving = True
        if self.connected:
            self._send(m.encode(m.FrontendLeaving()))

    async def close(self) -> None:
        """Close the sockets; requests still waiting are left as they are. A caller
        cancelled after this (asyncio.run cancels whatever is left) sends no Cancel: the
        broker drops the queued requests of a frontend that exits, as failures."""
        if self._greeter is not None:
            self._greeter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._greeter
        # Before the sockets go: a send on a closed one raises ZMQError (ENOTSOCK).
        self._closed = True
        self._welcomed.clear()
        self._unwatch()
        if self._loop is not None:
            self._loop.remove_reader(self.sock.FD)
            self._loop.remove_reader(self.results.fileno())
            for fd in self._links:
                self._loop.remove_reader(fd)
        for conn, _ in self._links.values():
            conn.close()
        self._links.clear()
        self.sock.close(_CLOSE_LINGER_MS)  # what was sent last (FrontendLeaving) goes out
        self.results.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._results_path)
        self.ctx.term()
