"""A model-instance worker process: one model version, one instance, one backend. The I/O
shell (its sockets, loop and signals) around the pure core that runs its batches
(shoal/workers/instance.py), the model's load (shoal/workers/loading.py) and a decoupled
model's open requests (shoal/workers/streams.py).

Lifecycle: settings -> logging -> signal flag -> connect and say hello -> load the model
and complete its config -> READY (or FAILED, then exit) -> execute batches until told
to stop or the flag is set -> release mappings and sockets.

The broker is a sibling, not a parent (under supervisord). The worker watches the
broker's pid through a pidfd and, when it dies, greets the next broker that binds the
same endpoint, so a broker restart does not need worker restarts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections import deque
from typing import Any

import zmq

from shoal.configs.model_config import ConfigError
from shoal.ipc import custom_metrics, logs, sockets
from shoal.ipc import messages as m
from shoal.ipc.event_wait import EventWait
from shoal.ipc.lifecycle import EXIT_FATAL, EXIT_RETIRED, raise_open_file_limit, settle_gc
from shoal.ipc.result_link import ResultSender
from shoal.ipc.shm import RegionMap
from shoal.workers import backend as backends
from shoal.workers import faults, loading, pb_metrics, pb_utils, trace_note, welcome
from shoal.workers.cancels import RunningCancels
from shoal.workers.cuda_regions import CudaRegions
from shoal.workers.instance import Answers, ModelInstance
from shoal.workers.loading import WorkerSettings
from shoal.workers.readiness import ReadinessCheck, ReadinessServer
from shoal.workers.streams import DecoupledStreams

log = logging.getLogger("shoal.worker")

_HELLO_RETRY_S = 1.0
_SWEEP_MAPPINGS_S = 5.0
_CLOSE_LINGER_MS = 1000  # how long unsent answers may hold a stopping worker


class WorkerProc:
    def __init__(self, settings: WorkerSettings) -> None:
        self.s = settings
        self.stop = False
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        ident = f"w-{settings.model}-{settings.version}-{settings.instance}-{os.getpid()}"
        self.sock = sockets.dealer(
            self.ctx, sockets.endpoint(settings.runtime_dir, sockets.WORKER_SOCKET), ident.encode()
        )
        self.regions = RegionMap()
        self.backend: backends.Backend | None = None
        self.instance: ModelInstance | None = None  # once loaded: runs its batches
        self.config_bytes = b""
        self.threads = 0  # intra-op threads its backend was given (WorkerReady.threads)
        self.broker_pidfd: int | None = None
        self.rejoin = False  # a broker it served under exited
        self.result_socks: dict[bytes, ResultSender] = {}
        self._gone: set[bytes] = set()  # frontends that exited: no link to them again
        self.cuda = CudaRegions(settings.gpu)
        self.retired = False  # told to stop for good: its model was unloaded or replaced
        # A decoupled model answers from its own threads too: what they touch (the result
        # sockets, the mappings, the streams) is the main loop's only while it holds this
        # lock, which it lets go while the model's code runs (shoal/workers/streams.py).
        # The broker socket stays the main loop's alone: the eventfd wakes the loop to
        # report ended streams.
        self.io_lock = threading.RLock()
        self.streams: DecoupledStreams | None = None  # a decoupled model's open requests
        self.cancels: RunningCancels | None = None  # another Python model's cancels
        self.readiness: ReadinessServer | None = None  # its model's own readiness check
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._welcomed = False
        self._last_hello = self._last_sweep = 0.0
        # Messages read while the model ran (looking for cancels), handled next, in order.
        self._deferred: deque[list[bytes]] = deque()
        self.scripting: Any = (
            None  # a Python model's requests to other models (shoal/workers/bls.py)
        )

    # -- startup ---------------------------------------------------------------------

    def _hello(self) -> None:
        s = self.s
        gpu = -1 if s.gpu is None else s.gpu
        hello = m.WorkerHello(
            s.model,
            s.version,
            s.instance,
            os.getpid(),
            self.rejoin,
            gpu,
            s.instance_name,
            s.generation,
        )
        self.sock.send_multipart(m.encode(hello))

    def load(self) -> m.WorkerReady | m.WorkerFailed:
        """Load the model (shoal/workers/loading.py); what to tell the broker."""
        s = self.s
        try:
            loaded = loading.load(s, self._start_scripting)
        except Exception as exc:  # any load failure is reported, never raised past here
            msg = exc.message if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
            log.error("failed to load '%s' version %d: %s", s.model, s.version, msg)
            return m.WorkerFailed(f"failed to load '{s.model}' version {s.version}: {msg}")
        self.backend = loaded.backend
        instance = self.instance = ModelInstance(
            loaded, s.model, s.version, self.regions, self.cuda
        )
        if instance.decoupled:
            instance.streams = self.streams = DecoupledStreams(
                instance,
                s.instance_name,
                self.io_lock,
                self._answer_frontend,
                self._read_cancels,
                self._wake,
                self._where,
                self._bls_children,
            )
        elif instance.per_request:  # a Python model: its requests' is_cancelled()
            instance.cancels = self.cancels = RunningCancels(self._read_cancels, self.sock)
            loaded.backend.wait_async = self.cancels.wait  # type: ignore[attr-defined]
        self.config_bytes = loaded.config_bytes
        self._serve_readiness(loaded.backend)
        threads = loaded.threads
        log.info(
            "loaded '%s' version %d instance %d (%s) on %s",
            s.model,
            s.version,
            s.instance,
            f"{threads} threads" if threads else "the backend's default threads",
            f"GPU {s.gpu}" if s.gpu is not None else f"cores {s.cores or 'any'}",
        )
        self.threads = threads
        return self._ready()

    def _ready(self) -> m.WorkerReady:
        s, checks = self.s, self.readiness is not None
        return m.WorkerReady(self.config_bytes, list(s.cores), self.threads, checks)

    def _serve_readiness(self, backend: Any) -> None:
        """A model with a readiness check of its own (a Python model's ``is_ready``)
        answers probes on its socket (shoal/workers/readiness.py)."""
        readiness = getattr(backend, "readiness", None)
        call = readiness() if readiness is not None else None
        if call is not None and self.readiness is None:
            path = sockets.readiness_path(self.s.runtime_dir, os.getpid())
            name = self.s.instance_name or self.s.model
            self.readiness = ReadinessServer(path, ReadinessCheck(call), name)

    def _start_scripting(self) -> None:
        """A Python model may call other models (shoal/workers/bls.py) and keep metrics of
        its own (shoal/workers/pb_metrics.py), which the frontends read from its file."""
        from shoal.workers.bls import BlsClient  # (the data plane's modules: Python's only)

        self.scripting = pb_utils.scripting = BlsClient(self.s.runtime_dir)
        pid = os.getpid()
        pb_metrics.publish_to(custom_metrics.snapshot_path(self.s.runtime_dir, pid), pid)

    # -- loop ------------------------------------------------------------------------

    def run(self) -> int:
        self._hello()
        broker_pid, shutdown = welcome.before_load(self.sock)
        if shutdown is not None:
            self.stop, self.retired = True, shutdown.retire
        if self.retired:  # unloaded (or replaced) before it loaded
            return EXIT_RETIRED
        # One descriptor per client region it maps; raised (and logged) once the
        # broker's log settings apply.
        raise_open_file_limit()
        outcome = self.load()
        for attempt in range(self.s.load_retries):  # Triton's: the same load, again
            if not isinstance(outcome, m.WorkerFailed):
                break
            log.info("load retry %d of %d", attempt + 1, self.s.load_retries)
            outcome = self.load()
        for attempt in range(self.s.load_retries):  # Triton's: the same load, again
            if not isinstance(outcome, m.WorkerFailed):
                break
            log.info("load retry %d of %d", attempt + 1, self.s.load_retries)
            outcome = self.load()
        self.sock.send_multipart(m.encode(outcome))
        if isinstance(outcome, m.WorkerFailed):
            if broker_pid is None:  # welcomed already: the broker reads what follows
                welcome.after_failure(self.sock, lambda: self.stop)
            time.sleep(0.2)  # the failure is read before the broker sees this pid exit
            return EXIT_FATAL  # a restart would fail the same way
        settle_gc()
        poller = EventWait()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self._wake, zmq.POLLIN)
        if broker_pid is not None:
            self._watch_broker(broker_pid, poller)
        self._welcomed = self.broker_pidfd is not None
        self._last_hello = self._last_sweep = time.monotonic()
        try:
            while not self.stop:
                # (requests a model rescheduled run again once nothing waits to be read)
                events = dict(poller.poll(0 if self._rescheduled() else 500))
                with self.io_lock:
                    try:
                        if self._turn(poller, events) == "shutdown":
                            break
                    finally:
                        self._report_ended()  # also those that ended while the model ran
        finally:
            poller.close()
        return EXIT_RETIRED if self.retired else 0

    def _turn(self, poller: EventWait, events: dict[Any, int]) -> str:
        """One turn of the loop over what the poll found (``io_lock`` held)."""
        if self._wake in events:
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self._wake)
        if time.monotonic() - self._last_sweep > _SWEEP_MAPPINGS_S:
            # Growth slabs a frontend unlinked: let their pages go (busy or not: a
            # steady trickle of requests must not keep them mapped for ever).
            self.regions.drop_unlinked()
            self._forget_exited_frontends()
            self._last_sweep = time.monotonic()
        if self.broker_pidfd is not None and self.broker_pidfd in events:
            self._broker_lost(poller)
            self._welcomed = False
        if self.sock in events or self._deferred:
            if self._drain(poller) == "shutdown":
                return "shutdown"
            self._welcomed = self._welcomed or self.broker_pidfd is not None
        if self._rescheduled() and not events:
            self._run_rescheduled()
        if not self._welcomed and time.monotonic() - self._last_hello > _HELLO_RETRY_S:
            self._hello()
            self.sock.send_multipart(m.encode(self._ready()))
            self._last_hello = time.monotonic()
        return ""

    def _report_ended(self) -> None:
        """Tell the broker which open streams got their final response, and which
        rescheduled requests ended (shoal/workers/rescheduling.py)."""
        keys = self.streams.take_ended() if self.streams is not None else []
        if self.instance is not None and self.instance.rescheduled.ended:
            keys += self.instance.rescheduled.take_ended()
        if keys:
            sockets.send_frames(self.sock, m.encode(m.StreamsEnded(keys)))

    def _rescheduled(self) -> bool:
        return self.instance is not None and bool(self.instance.rescheduled)

    def _run_rescheduled(self) -> None:
        """Run the requests the model rescheduled (``io_lock`` held), and report the run
        to the broker (RerunDone: its statistics): a decoupled model's answer through
        their senders; the others' answers go to their frontends here."""
        assert self.instance is not None
        if self.streams is not None:
            sockets.send_frames(self.sock, m.encode(self.streams.rerun()))
            return
        done, answers = self.instance.rerun()
        sockets.send_frames(self.sock, m.encode(done))  # (before the answers: _send_answers)
        direct: dict[bytes, list[bytes]] = {}
        for item, resp in answers:
            direct.setdefault(item.frontend, []).append(m.encode_payload(resp))
        for frontend, payloads in direct.items():
            self._answer_frontend(frontend, payloads)

    def _drain(self, poller: EventWait) -> str:
        while True:
            if self._deferred:
                frames = self._deferred.popleft()
            elif sockets.readable(self.sock):
                frames = sockets.recv_frames(self.sock, sockets.NOBLOCK)
            else:
                return ""
            try:
                msg = m.decode(frames[0], frames[1])
            except (ValueError, IndexError) as exc:
                log.warning("dropped a malformed message from the broker: %s", exc)
                continue
            if isinstance(msg, m.ExecuteBatch):
                self.execute(msg)
            elif isinstance(msg, m.Welcome):
                self._watch_broker(msg.broker_pid, poller)
                if msg.log is not None:
                    logs.apply(msg.log)
            elif isinstance(msg, m.LogSettings):
                logs.apply(msg)
            elif isinstance(msg, m.RegionsReleased):
                self.regions.release_clients(msg.reg_ids)
                self.cuda.release(msg.reg_ids)
            elif isinstance(msg, m.FrontendGone):
                self._forget_frontend(msg.frontend)
            elif isinstance(msg, m.Cancel):
                self._cancel(msg)
            elif isinstance(msg, m.Shutdown):
                if msg.retire and not self._broker_alive():
                    # Retired by a broker that has exited since (a message read after
                    # its death): the next one serves the start-up models again, and
                    # says what becomes of this instance once it is greeted.
                    log.info("not stopping: the broker that retired this instance exited")
                    continue
                log.info("stopping: %s", msg.reason or "asked to")
                self.retired = msg.retire
                return "shutdown"

    def _forget_exited_frontends(self) -> None:
        """The broker names each frontend that exits (FrontendGone); one that exited
        while no broker ran is found here, by its pid."""
        for frontend in list(self.result_socks):
            pid = sockets.frontend_pid(frontend)
            if pid is None:
                continue
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                self._forget_frontend(frontend)
            except PermissionError:  # a process of another user took the pid: gone too
                self._forget_frontend(frontend)

    def _forget_frontend(self, frontend: bytes) -> None:
        """Its result socket and its slabs' mappings go, so their memory can be freed;
        its requests a decoupled model still answers are cancelled."""
        self._gone.add(frontend)  # (identities carry the pid: never one again)
        if self.streams is not None:
            self.streams.frontend_gone(frontend)
        if self.cancels is not None:
            self.cancels.frontend_gone(frontend)
        dead = self.result_socks.pop(frontend, None)
        if dead is not None:
            dead.close()
        pid = sockets.frontend_pid(frontend)
        if pid is not None:
            self.regions.forget_owner(pid)

    def _watch_broker(self, pid: int, poller: EventWait) -> None:
        if self.broker_pidfd is not None:
            poller.unregister(self.broker_pidfd)
            os.close(self.broker_pidfd)
        try:
            self.broker_pidfd = os.pidfd_open(pid)
            poller.register(self.broker_pidfd, zmq.POLLIN)
        except OSError:
            # The broker that welcomed it is gone already (killed and reaped while this
            # worker loaded its model, say): the next one must know it rejoins, or it
            # waits for every instance of the version, even those that died meanwhile.
            self.broker_pidfd = None
            self.rejoin = True

    def _broker_alive(self) -> bool:
        """Whether the broker that last welcomed this worker still runs (what it sent
        comes before what any later broker sends)."""
        fd = self.broker_pidfd
        return fd is not None and not select.select([fd], [], [], 0)[0]

    def _broker_lost(self, poller: EventWait) -> None:
        log.warning("broker exited; waiting for a new one")
        assert self.broker_pidfd is not None
        poller.unregister(self.broker_pidfd)
        os.close(self.broker_pidfd)
        self.broker_pidfd = None
        self.rejoin = True
        self.regions.close()
        self.cuda.close()  # the next broker numbers its registrations afresh

    # -- execution -------------------------------------------------------------------

    def execute(self, batch: m.ExecuteBatch) -> None:
        """Run one batch (shoal/workers/instance.py), answer each request, then report the
        batch to the broker. The answers go first, so that a death in between rarely costs
        one; if it does, the broker, which stops answering a batch's requests itself once
        it has the report, names them to their frontends (``Unconfirmed``) and the ones
        still waiting fail there."""
        received = time.monotonic_ns()  # (for requests whose hops are measured)
        t0 = time.perf_counter_ns()
        if self.s.fault.startswith("leak"):
            faults.leak(slow=self.s.fault == "leak-in-batch")
        assert self.instance is not None
        if self.scripting is not None:  # its BLS requests: a traced request's children
            self.scripting.batch = batch
        done, answers = self.instance.run(batch, t0)
        if self.scripting is not None:
            self.scripting.batch = None
        if self.s.fault == "die-after-report":
            faults.die_after_report(self.sock, done)
        self._send_answers(done, answers, received)
        if log.isEnabledFor(logging.DEBUG):  # --log-verbose > 0
            log.debug(
                "batch %d: %d request(s), %d sample(s), %d failed; input %d µs, infer %d µs, "
                "output %d µs", batch.batch_id, len(batch.items), done.batch_size,
                len(done.failed), done.input_ns // 1000, done.infer_ns // 1000,
                done.output_ns // 1000,
            )  # fmt: skip

    def _way(
        self, item: m.WorkItem, answers: Answers, done: m.BatchDone, received: int, sent: int
    ) -> list[int] | m.TracedAnswer:
        """A measured request's answer's ``hops``: the way so far, the batch's receipt and
        the answer's send; a traced one's with this worker's part (trace_note.py)."""
        way = item.request.hops
        if isinstance(way, list):
            return [*way, received, sent]
        where = self._where()
        others = [i.request.req_id for i, _ in answers if i is not item]
        children = self._bls_children(way.id)
        return trace_note.traced_answer(way, others, done, received, sent, where, children)

    def _stamp(
        self,
        item: m.WorkItem,
        resp: m.InferResponse,
        answers: Answers,
        done: m.BatchDone,
        received: int,
        sent: int,
    ) -> int:
        """A measured (or traced) request's answer gets its ``hops`` (``_way``), sent at
        ``sent`` (now, if 0), whether it goes straight to its frontend or through the
        broker (preserve_ordering). Returns the send time used."""
        if item.request.hops:
            sent = sent or time.monotonic_ns()
            resp.hops = self._way(item, answers, done, received, sent)
        return sent

    def _bls_children(self, trace_id: int) -> list[m.TraceRecord]:
        """The BLS traces the traced request ``trace_id`` spawned (taken)."""
        return self.scripting.children(trace_id) if self.scripting is not None else []

    def _where(self) -> trace_note.Attrs:
        """What a traced request's spans say ran it: this process and its instance."""
        s = self.s
        name = s.instance_name or f"{s.model}_{s.instance}"
        return trace_note.where(os.getpid(), name, list(s.cores), s.gpu)

    def _send_answers(self, done: m.BatchDone, answers: Answers, received: int) -> None:
        """The batch's report, and its answers (``received``: when the batch came, for the
        requests whose hops are measured)."""
        # The report goes before the answers sent straight to frontends, so that a client
        # holding its answer finds its request in the statistics (the broker reads the
        # workers' messages before the frontends' in each turn). Answers in order
        # (preserve_ordering) go before it on the same socket: a report the broker has
        # read always follows them. A death between the report and the direct answers
        # leaves those to the broker's unconfirmed-answers rule (router.unconfirmed).
        sent = 0
        for item, resp in answers:
            if item.seq:
                sent = self._stamp(item, resp, answers, done, received, sent)
                self._answer_ordered(item, resp)
        sockets.send_frames(self.sock, m.encode(done))
        direct: dict[bytes, list[bytes]] = {}  # per frontend: one message for the batch
        sent = 0
        for item, resp in answers:
            if not item.seq:
                sent = self._stamp(item, resp, answers, done, received, sent)
                direct.setdefault(item.frontend, []).append(m.encode_payload(resp))
        for frontend, payloads in direct.items():
            self._answer_frontend(frontend, payloads)

    def _read_cancels(self) -> None:
        """While the model runs on the loop's thread: the cancels the broker sent; what
        else it sent waits, in order, for the loop (``_deferred``)."""
        while sockets.readable(self.sock):
            frames = sockets.recv_frames(self.sock, sockets.NOBLOCK)
            try:
                msg = m.decode(frames[0], frames[1])
            except (ValueError, IndexError):
                msg = None
            if isinstance(msg, m.Cancel):
                self._cancel(msg)
            else:
                self._deferred.append(frames)

    def _cancel(self, msg: m.Cancel) -> None:
        """The client of a request the model runs (or a decoupled one still answers)
        gave up: the model's ``is_cancelled()`` says so from now on."""
        if self.streams is not None:
            self.streams.cancel(msg.frontend, msg.req_id)
        elif self.cancels is not None:
            self.cancels.cancel(msg.frontend, msg.req_id)
            if self.instance is not None:  # (one it holds, rescheduled, ends)
                self.instance.rescheduled.drop(msg.frontend, msg.req_id)

    def _answer_ordered(self, item: m.WorkItem, resp: m.InferResponse) -> None:
        """Through the broker, for a model that preserves ordering (it releases answers
        in arrival order)."""
        frames = [m.RESULT, item.frontend, str(item.seq).encode(), m.encode_payload(resp)]
        sockets.send_frames(self.sock, frames)

    def _answer_frontend(self, frontend: bytes, payloads: list[bytes]) -> None:
        """Answers straight to the frontend that asked, in one message."""
        link = self.result_socks.get(frontend)
        if link is None or link.closed:
            if frontend in self._gone:  # (its answers were cancelled)
                return
            try:
                link = ResultSender(sockets.result_path(self.s.runtime_dir, frontend))
            except ValueError:
                log.warning("result for an invalid frontend identity dropped")
                return
            except OSError as exc:
                log.warning(
                    "frontend %r cannot be reached (%s); %d result(s) dropped",
                    frontend, exc.strerror or exc, len(payloads),
                )  # fmt: skip
                return
            self.result_socks[frontend] = link
        if not link.send(payloads):
            log.warning("frontend %r is gone; %d result(s) dropped", frontend, len(payloads))

    def close(self) -> None:
        # finalize() first: a decoupled model's threads may still answer until it
        # returns (Triton's examples wait for them there). Requests still open after it
        # end with an error: nothing will answer them.
        if self.backend is not None:
            self.backend.unload()
            if self.s.instance == 0:  # (once a version, as Triton logs it: by its first)
                log.info("successfully unloaded '%s' version %d", self.s.model, self.s.version)
        if self.scripting is not None:
            self.scripting.close()
            pb_metrics.stop_publishing()
            custom_metrics.snapshot_path(self.s.runtime_dir, os.getpid()).unlink(missing_ok=True)
        if self.cancels is not None:
            self.cancels.close()
        if self.readiness is not None:
            self.readiness.close()
        with self.io_lock:
            self._end_open_streams()
            self.cuda.close()
            # The last answers leave first (an instance stopped over its memory limit has
            # just answered its batch); a frontend gone takes at most this long to give up.
            for link in self.result_socks.values():
                link.close(_CLOSE_LINGER_MS / 1000)
            self.result_socks.clear()
            self.regions.close()
            self.sock.close(_CLOSE_LINGER_MS)
        os.close(self._wake)

    def _end_open_streams(self) -> None:
        if self.streams is not None:
            self.streams.end_all(self.s.version)
