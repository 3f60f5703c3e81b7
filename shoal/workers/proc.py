"""A model-instance worker process: one model version, one instance, one backend.

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
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from shoal.configs import autocomplete as ac
from shoal.configs import repository
from shoal.configs.backend_params import (
    borrowing_threads,
    instance_threads,
    ort_session_params,
    torch_thread_params,
)
from shoal.configs.devices import gpu_count
from shoal.configs.model_config import (
    ConfigError,
    ModelConfig,
    parse_config_json,
    v2_datatype,
    validate_io,
)
from shoal.configs.placement import passive_instances
from shoal.ipc import datatypes, logs, sockets
from shoal.ipc import messages as m
from shoal.ipc.errors import Code, ServingError
from shoal.ipc.lifecycle import EXIT_FATAL, EXIT_RETIRED, raise_open_file_limit, settle_gc
from shoal.ipc.result_link import ResultSender
from shoal.ipc.shm import RegionMap
from shoal.workers import backend as backends
from shoal.workers import classification, pb_utils, warmup
from shoal.workers.batch_io import BatchAssembler
from shoal.workers.cuda_regions import CudaRegions
from shoal.workers.python_backend import error_code
from shoal.workers.sequence_io import SequenceIO
from shoal.workers.tensors import (
    OutputTooLarge,
    host_span,
    input_array,
    output_destination,
    output_ref,
)

log = logging.getLogger("shoal.worker")

#: The smallest output a backend is given to write in place: below it, binding the
#: output (ONNX Runtime's IOBinding) costs more than copying it afterwards (measured:
#: about +8 us at 16-64 KiB, about even at 256 KiB, -0.3 ms at 4 MiB).
IN_PLACE_MIN_BYTES = 256 << 10

_HELLO_RETRY_S = 1.0
_SWEEP_MAPPINGS_S = 5.0
_FAILED_REPORT_WAIT_S = 10.0
# How long a starting worker waits for the broker's welcome before it loads its model:
# the welcome carries the server's log settings, which the load's own lines should obey.
_WELCOME_BEFORE_LOAD_S = 0.5
_CLOSE_LINGER_MS = 1000  # how long unsent answers may hold a stopping worker
_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


@dataclass
class WorkerSettings:
    model_repository: Path
    model: str
    version: int
    instance: int
    runtime_dir: Path
    autocomplete: bool = True
    model_config_name: str = ""
    default_max_batch_size: int = 4
    cores: list[int] = field(default_factory=list)
    gpu: int | None = None
    gpu_count: int | None = None  # the server's GPUs (this process sees only its own)
    instance_name: str = ""
    generation: int = 0  # the load it belongs to (model control)
    config_override: Path | None = None  # a load's JSON config, replacing config.pbtxt
    fault: str = ""  # SHOAL_TEST_FAULT's action, for tests only (see shoal/workers/__main__.py)
    may_use: int = 0  # cores it may run on while idle instances lend theirs (0: its own)


@dataclass
class _Stream:
    """A decoupled model's request, from its batch until its final response."""

    item: m.WorkItem
    reported_open: bool = False  # its BatchDone named it open: StreamsEnded names its end
    cancelled: bool = False  # its client gave up (the broker said so)


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
        self.config_bytes = b""
        self.threads = 0  # intra-op threads its backend was given (WorkerReady.threads)
        self.max_batch_size = 0
        self.assembler = BatchAssembler()
        self.sequence: SequenceIO | None = None  # a stateful model's controls and state
        self.output_types: dict[str, str] = {}
        self.labels: dict[str, list[str]] = {}  # per output, from its label_filename
        self.output_dims: dict[str, list[int]] = {}
        self.broker_pidfd: int | None = None
        self.rejoin = False  # a broker it served under exited
        self.result_socks: dict[bytes, ResultSender] = {}
        self.cuda = CudaRegions(settings.gpu)
        self.retired = False  # told to stop for good: its model was unloaded or replaced
        # A decoupled model answers from its own threads too: what they touch (the result
        # sockets, the mappings, the streams) is the main loop's only while it holds this
        # lock, which it lets go while the model's code runs. The broker socket stays the
        # main loop's alone: ended streams wait in _ended and the eventfd wakes the loop.
        self.io_lock = threading.RLock()
        self.streams: dict[tuple[bytes, int], _Stream] = {}
        self._ended: list[tuple[bytes, int]] = []
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._welcomed = False
        self._last_hello = self._last_sweep = 0.0
        # Messages read while the model ran (looking for cancels), handled next, in order.
        self._deferred: deque[list[bytes]] = deque()
        self._main_thread = threading.get_ident()
        self._gone: set[bytes] = set()  # frontends that exited: their streams go unsent
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
        s = self.s
        try:
            override = None
            if s.config_override is not None:
                override = parse_config_json(s.config_override.read_text(), s.model)
            entry = repository.find(
                s.model_repository,
                s.model,
                model_config_name=s.model_config_name,
                autocomplete_enabled=s.autocomplete,
                gpu_count=s.gpu_count if s.gpu_count is not None else gpu_count(),
                config_override=override,
            )
            if entry is None or entry.error or entry.config is None:
                reason = entry.error if entry is not None else "no such model directory"
                raise ConfigError(s.model, reason or "no config")
            config = entry.config
            backend_name = config.backend or "onnxruntime"
            backend = backends.create(backend_name)
            if backend_name == "python":  # its model may call other models
                from shoal.workers.bls import BlsClient  # (a frontend's modules: Python's only)

                self.scripting = pb_utils.scripting = BlsClient(s.runtime_dir)
            backend.instance_name = s.instance_name  # type: ignore[attr-defined]  # (Python's)
            backend.default_max_batch_size = s.default_max_batch_size  # type: ignore[attr-defined]
            model_file = entry.model_file(s.version)
            if s.autocomplete and hasattr(backend, "auto_complete"):  # a Python model's own
                config = backend.auto_complete(model_file, config)
            weight = _files_bytes(model_file) if s.may_use > len(s.cores) else 0
            threads = _thread_count(config, backend_name, s.cores, s.may_use, weight)
            backend.load(model_file, config, threads, s.gpu is not None)
            specs = backend.io_spec()
            model_ins: set[str] | None = None
            model_outs: set[str] | None = None
            if specs is not None:
                ins, outs = specs
                model_ins, model_outs = {i.name for i in ins}, {o.name for o in outs}
                if s.autocomplete:
                    config = ac.autocomplete(
                        config, ins, outs, default_max_batch_size=s.default_max_batch_size
                    )
                ac.check_against_model(config, ins, outs)
            validate_io(config)
            assembler = BatchAssembler.from_config(config)
            sequence = SequenceIO.from_config(config, entry.path, model_ins, model_outs)
            labels = classification.labels_of(config, entry.path)
            if s.instance not in passive_instances(config):  # Triton warms these alone
                self._warm_up(config, entry.path, backend, assembler, sequence)
        except Exception as exc:  # any load failure is reported, never raised past here
            msg = exc.message if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
            log.error("failed to load '%s' version %d: %s", s.model, s.version, msg)
            return m.WorkerFailed(f"failed to load '{s.model}' version {s.version}: {msg}")
        self.backend = backend
        self.max_batch_size = config.max_batch_size
        self.assembler = assembler
        self.sequence = sequence
        self.labels = labels
        self.output_types = {o.name: v2_datatype(o.data_type) for o in config.output}
        # Outputs whose shape is known before the run (fixed dims, no reshape, not split
        # by an input's shape): a lone request's may be written in place (_destinations).
        self.output_dims = {
            o.name: list(o.dims)
            for o in config.output
            if not o.HasField("reshape")
            and all(d >= 0 for d in o.dims)
            and o.name not in assembler.scatter_specs
        }
        self.config_bytes = config.SerializeToString()
        log.info(
            "loaded '%s' version %d instance %d (%s) on %s",
            s.model,
            s.version,
            s.instance,
            f"{threads} threads" if threads else "the backend's default threads",
            f"GPU {s.gpu}" if s.gpu is not None else f"cores {s.cores or 'any'}",
        )
        self.threads = threads
        return m.WorkerReady(self.config_bytes, list(s.cores), threads)

    def _warm_up(
        self,
        config: ModelConfig,
        model_dir: Path,
        backend: backends.Backend,
        assembler: BatchAssembler,
        sequence: SequenceIO | None,
    ) -> None:
        """The config's model_warmup samples (shoal/workers/warmup.py), a sequence model's with
        its control tensors and initial state; raises ConfigError."""

        def gather(feeds: list[dict[str, Any]]) -> dict[str, Any]:
            if sequence is not None:
                feeds = [sequence.warmup_row(f) for f in feeds]
            return assembler.gather(feeds)

        for sample in warmup.samples(config, model_dir):
            seconds = warmup.run(
                config,
                sample,
                lambda feeds, outputs: backend.execute(feeds, outputs, None),
                gather,
            )
            log.info(
                "instance %d warmed up with sample '%s' (batch %d, %d time(s)) in %.0f ms",
                self.s.instance, sample.name, sample.batch_size, sample.count, seconds * 1000,
            )  # fmt: skip

    def _await_welcome(self) -> None:
        """Stay until a broker has read this worker's hello, and so the failure queued
        behind it (at most _FAILED_REPORT_WAIT_S, or until told to stop).

        The socket drops unsent messages when it closes: a worker that fails before the
        broker binds (a loaded host, or supervisord starting it first) would otherwise
        leave its model LOADING for good, with the reason lost.
        """
        deadline = time.monotonic() + _FAILED_REPORT_WAIT_S
        while not self.stop and time.monotonic() < deadline:
            if not self.sock.poll(100, zmq.POLLIN):
                continue
            frames = self.sock.recv_multipart(copy=True)
            with contextlib.suppress(ValueError, IndexError):
                if isinstance(m.decode(frames[0], frames[1]), m.Welcome):
                    return

    # -- loop ------------------------------------------------------------------------

    def _welcome_before_load(self) -> int | None:
        """The broker's pid from its welcome, if one comes within _WELCOME_BEFORE_LOAD_S
        (its log settings applied); None if the broker is not there yet. Nothing else
        the broker sends before WorkerReady needs this worker (no region is mapped yet),
        but a shutdown."""
        deadline = time.monotonic() + _WELCOME_BEFORE_LOAD_S
        while (left := deadline - time.monotonic()) > 0:
            if not self.sock.poll(int(left * 1000) + 1, zmq.POLLIN):
                return None
            frames = self.sock.recv_multipart(copy=True)
            try:
                msg = m.decode(frames[0], frames[1])
            except (ValueError, IndexError):
                continue
            if isinstance(msg, m.Welcome | m.LogSettings):
                settings = msg.log if isinstance(msg, m.Welcome) else msg
                if settings is not None:
                    logs.apply(settings)
            if isinstance(msg, m.Welcome):
                return msg.broker_pid
            if isinstance(msg, m.Shutdown):
                self.stop = True
                self.retired = msg.retire
        return None

    def run(self) -> int:
        self._hello()
        broker_pid = self._welcome_before_load()
        if self.retired:  # unloaded (or replaced) before it loaded
            return EXIT_RETIRED
        # One descriptor per client region it maps; raised (and logged) once the
        # broker's log settings apply.
        raise_open_file_limit()
        outcome = self.load()
        self.sock.send_multipart(m.encode(outcome))
        if isinstance(outcome, m.WorkerFailed):
            if broker_pid is None:  # welcomed already: the broker reads what follows
                self._await_welcome()
            time.sleep(0.2)  # the failure is read before the broker sees this pid exit
            return EXIT_FATAL  # a restart would fail the same way
        settle_gc()
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self._wake, zmq.POLLIN)
        if broker_pid is not None:
            self._watch_broker(broker_pid, poller)
        self._welcomed = self.broker_pidfd is not None
        self._last_hello = self._last_sweep = time.monotonic()
        while not self.stop:
            events = dict(poller.poll(500))
            with self.io_lock:
                try:
                    if self._turn(poller, events) == "shutdown":
                        break
                finally:
                    self._report_ended()  # also those that ended while the model ran
        return EXIT_RETIRED if self.retired else 0

    def _turn(self, poller: zmq.Poller, events: dict[Any, int]) -> str:
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
        if not self._welcomed and time.monotonic() - self._last_hello > _HELLO_RETRY_S:
            self._hello()
            ready = m.WorkerReady(self.config_bytes, self.s.cores, self.threads)
            self.sock.send_multipart(m.encode(ready))
            self._last_hello = time.monotonic()
        return ""

    def _report_ended(self) -> None:
        """Tell the broker which open streams got their final response."""
        if self._ended:
            keys, self._ended = self._ended, []
            sockets.send_frames(self.sock, m.encode(m.StreamsEnded(keys)))

    def _drain(self, poller: zmq.Poller) -> str:
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
                stream = self.streams.get((msg.frontend, msg.req_id))
                if stream is not None:
                    stream.cancelled = True
            elif isinstance(msg, m.Shutdown):
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
        for stream in self.streams.values():
            if stream.item.frontend == frontend:
                stream.cancelled = True
        dead = self.result_socks.pop(frontend, None)
        if dead is not None:
            dead.close()
        pid = sockets.frontend_pid(frontend)
        if pid is not None:
            self.regions.forget_owner(pid)

    def _watch_broker(self, pid: int, poller: zmq.Poller) -> None:
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

    def _broker_lost(self, poller: zmq.Poller) -> None:
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
        """Run one batch: gather the requests' inputs (one copy when there are several),
        execute once, split the outputs back per request (views) and write them, answer
        each request, then report the batch to the broker. The answers go first, so that
        a death in between rarely costs one; if it does, the broker, which stops
        answering a batch's requests itself once it has the report, names them to their
        frontends (``Unconfirmed``) and the ones still waiting fail there."""
        received = time.monotonic_ns()  # (for requests whose hops are measured)
        t0 = time.perf_counter_ns()
        if self.s.fault.startswith("leak"):
            _leak(slow=self.s.fault == "leak-in-batch")
        failed: list[int] = []
        refused: list[int] = []
        answers: list[tuple[m.WorkItem, m.InferResponse]] = []
        live: list[tuple[int, m.WorkItem, dict[str, np.ndarray]]] = []  # (position, ..)
        for pos, item in enumerate(batch.items):
            clients = {c.reg_id: c for c in item.regions}
            try:
                tensors = {
                    t.name: input_array(t, self.regions, clients, self.cuda, item.request.model)
                    for t in item.request.inputs
                }
                live.append((pos, item, tensors))
            except datatypes.BytesLayoutError as exc:  # Triton's own words, as they are
                failed.append(pos)
                refused.append(pos)
                error = _error(item, Code.INVALID_ARG, exc.message, exc.names_request)
                answers.append((item, error))
            except Exception as exc:
                failed.append(pos)
                answers.append(
                    (item, _error(item, Code.INVALID_ARG, f"bad input reference: {exc}"))
                )
        t1 = t2 = t0
        samples = 0
        seq = self.sequence
        still_open: list[int] = []
        if live and getattr(self.backend, "decoupled", False):
            t1, t2, samples = self._execute_decoupled(live, failed, still_open)
            live = []
        elif live and getattr(self.backend, "per_request", False):  # a Python model
            t1, t2, samples = self._execute_requests(live, failed, answers, batch.rows)
            live = []
        if live:
            names = sorted({o.name for _, it, _ in live for o in it.request.outputs})
            sizes = [max(it.request.batch_size, 1) for _, it, _ in live]
            samples = sum(sizes) if self.max_batch_size > 0 else len(live)
            try:
                requests = [f for _, _, f in live]
                rows: list[int] = []  # a Direct batch's row of each live request
                if seq is not None:
                    names = sorted({*names, *seq.state_outputs})
                    for _, it, f in live:
                        seq.add(it, f)
                    if batch.rows:
                        requests, rows, sizes = self._sequence_rows(batch.rows, live)
                        samples = len(requests)
                feeds = self.assembler.gather(requests)
                t1 = time.perf_counter_ns()
                assert self.backend is not None
                in_place = len(live) == 1 and getattr(self.backend, "writes_in_place", False)
                dests = self._destinations(live[0][1]) if in_place and seq is None else None
                arrays = self.backend.execute(feeds, names, dests)
                per_request = self.assembler.scatter(names, arrays, sizes, requests)
                if rows:
                    per_request = [per_request[row] for row in rows]
                if seq is not None:
                    for (_, it, _), outs in zip(live, per_request, strict=True):
                        seq.keep(it, outs)
            except Exception as exc:
                code, message = (
                    (exc.code, exc.message)
                    if isinstance(exc, ServingError)
                    else (Code.INTERNAL, f"{type(exc).__name__}: {exc}")
                )
                if code == Code.INTERNAL:
                    log.exception("execution failed")
                for pos, it, _ in live:
                    failed.append(pos)
                    answers.append((it, _error(it, code, message)))
                live = []
            t2 = time.perf_counter_ns()
            if live:
                for (pos, it, _), outs in zip(live, per_request, strict=True):
                    resp = self._result(it, outs)
                    if resp.error is not None:
                        failed.append(pos)
                    answers.append((it, resp))
        t3 = time.perf_counter_ns()
        done = m.BatchDone(
            batch.batch_id, samples, t1 - t0, t2 - t1, t3 - t2, failed, refused, still_open
        )
        if self.s.fault == "die-after-report":
            self._die_after_report(done)
        # The report goes before the answers sent straight to frontends, so that a client
        # holding its answer finds its request in the statistics (the broker reads the
        # workers' messages before the frontends' in each turn). Answers in order
        # (preserve_ordering) go before it on the same socket: a report the broker has
        # read always follows them. A death between the report and the direct answers
        # leaves those to the broker's unconfirmed-answers rule (router.unconfirmed).
        for item, resp in answers:
            if item.seq:
                self._answer_ordered(item, resp)
        sockets.send_frames(self.sock, m.encode(done))
        direct: dict[bytes, list[bytes]] = {}  # per frontend: one message for the batch
        sent = 0
        for item, resp in answers:
            if not item.seq:
                if item.request.hops:  # measured: the way so far, its receipt, its send
                    sent = sent or time.monotonic_ns()
                    resp.hops = [*item.request.hops, received, sent]
                direct.setdefault(item.frontend, []).append(m.encode_payload(resp))
        for frontend, payloads in direct.items():
            self._answer_frontend(frontend, payloads)
        if log.isEnabledFor(logging.DEBUG):  # --log-verbose > 0
            log.debug(
                "batch %d: %d request(s), %d sample(s), %d failed; input %d µs, infer %d µs, "
                "output %d µs", batch.batch_id, len(batch.items), samples, len(failed),
                done.input_ns // 1000, done.infer_ns // 1000, done.output_ns // 1000,
            )  # fmt: skip

    def _execute_requests(
        self,
        live: list[tuple[int, m.WorkItem, dict[str, np.ndarray]]],
        failed: list[int],
        answers: list[tuple[m.WorkItem, m.InferResponse]],
        rows: int = 0,
    ) -> tuple[int, int, int]:
        """A backend that takes the batch's requests one by one (Python models): each
        request's own tensors in, its own outputs or error out. A Direct sequence batch
        of ``rows`` rows also gets a null request (READY false) for each row without a
        request, as Triton gives the model, and their answers are dropped. Returns the
        times the execution began and ended, and the samples it ran."""
        backend: Any = self.backend
        t1 = time.perf_counter_ns()
        pairs = [(it.request, tensors) for _, it, tensors in live]
        positions = list(range(len(live)))  # each live request's place among the requests
        try:
            if self.sequence is not None:
                for _, it, tensors in live:
                    self.sequence.add(it, tensors)
                if rows > len(live):
                    pairs, positions = self._null_requests(rows, live)
            requests = backend.requests(pairs)
            t1 = time.perf_counter_ns()
            results = backend.execute_requests(requests)
            results = [results[i] for i in positions]
        except Exception as exc:  # the model's fault, never the worker's end
            log.exception("model '%s': requests could not be run", self.s.model)
            results = [ServingError(Code.INTERNAL, f"{type(exc).__name__}: {exc}")] * len(live)
        t2 = time.perf_counter_ns()
        for (pos, it, _), result in zip(live, results, strict=True):
            if not isinstance(result, ServingError):
                result = self._model_outputs(it, result)
            if isinstance(result, ServingError):
                if result.code == Code.INTERNAL:
                    log.error("%s", result.message)
                failed.append(pos)
                answers.append((it, _error(it, result.code, result.message)))
                continue
            resp = self._result(it, result)
            if resp.error is not None:
                failed.append(pos)
            answers.append((it, resp))
        if rows > len(live):
            return t1, t2, rows
        sizes = [max(it.request.batch_size, 1) for _, it, _ in live]
        return t1, t2, sum(sizes) if self.max_batch_size > 0 else len(live)

    def _null_requests(
        self, rows: int, live: list[tuple[int, m.WorkItem, dict[str, np.ndarray]]]
    ) -> tuple[list[tuple[m.InferRequest, dict[str, np.ndarray]]], list[int]]:
        """A Direct batch's requests for a Python model, one per row: each live request
        in its slot's row, a null request (no correlation ID, READY false, zeros shaped
        as the first request's inputs, its outputs asked for) in the others. Returns
        them and each live request's row."""
        assert self.sequence is not None
        first = live[0][1].request
        null = m.InferRequest(0, first.model, first.version, [], first.outputs)
        by_row: list[tuple[m.InferRequest, dict[str, np.ndarray]] | None] = [None] * rows
        for _, it, tensors in live:
            by_row[it.slot] = (it.request, tensors)
        pairs = [p if p is not None else (null, self.sequence.null_row(live[0][2])) for p in by_row]
        return pairs, [it.slot for _, it, _ in live]

    def _execute_decoupled(
        self,
        live: list[tuple[int, m.WorkItem, dict[str, np.ndarray]]],
        failed: list[int],
        still_open: list[int],
    ) -> tuple[int, int, int]:
        """A decoupled Python model's batch: each request answers through its response
        sender, now or later, from any thread (``_deliver``). ``still_open`` gets the
        positions whose final response has not gone out when ``execute`` returns; the
        broker holds them open until StreamsEnded. An ``execute`` that fails ends each
        request not ended yet with the error (those count as failed). Returns as
        ``_execute_requests``."""
        backend: Any = self.backend
        senders = [self._sender(it) for _, it, _ in live]
        t1 = time.perf_counter_ns()
        try:
            if self.sequence is not None:  # (Oldest only: no null requests to answer)
                for _, it, tensors in live:
                    self.sequence.add(it, tensors)
            requests = backend.requests([(it.request, tensors) for _, it, tensors in live], senders)
            t1 = time.perf_counter_ns()
            with self._unlocked():  # the model's threads may answer meanwhile
                failure = backend.execute_decoupled(requests)
        except Exception as exc:  # the model's fault, never the worker's end
            log.exception("model '%s': requests could not be run", self.s.model)
            failure = (
                f"Failed to process the request(s) for model '{self.s.instance_name}', "
                f"message: {type(exc).__name__}: {exc}"
            )
        t2 = time.perf_counter_ns()
        # (the model's requests, and so their senders, are let go of: a sender the model
        # kept no reference to ends its request when this returns, through its __del__)
        requests = []
        if failure is not None:
            log.error("%s", failure)
        for (pos, it, _), sender in zip(live, senders, strict=True):
            if failure is not None and not sender.closed:
                failed.append(pos)
                error = pb_utils.InferenceResponse(error=pb_utils.TritonError(failure))
                # (a model thread's final flag may win the race: then it is closed)
                with contextlib.suppress(pb_utils.TritonModelException):
                    sender.send(error, _FINAL)
            stream = self.streams.get((it.frontend, it.request.req_id))
            if stream is not None:
                stream.reported_open = True
                still_open.append(pos)
        sizes = [max(it.request.batch_size, 1) for _, it, _ in live]
        return t1, t2, sum(sizes) if self.max_batch_size > 0 else len(live)

    def _sender(self, item: m.WorkItem) -> pb_utils.InferenceResponseSender:
        stream = self.streams[(item.frontend, item.request.req_id)] = _Stream(item)

        def deliver(response: pb_utils.InferenceResponse | None, final: bool) -> None:
            self._deliver(stream, response, final)

        def cancelled() -> bool:
            if not stream.cancelled and threading.get_ident() == self._main_thread:
                self._read_cancels()  # the model streams inside execute: the loop waits
            return stream.cancelled

        return pb_utils.InferenceResponseSender(deliver, cancelled)

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
                stream = self.streams.get((msg.frontend, msg.req_id))
                if stream is not None:
                    stream.cancelled = True
            else:
                self._deferred.append(frames)

    def _deliver(self, stream: _Stream, response: Any, final: bool) -> None:
        """One response of a decoupled model's request (``response`` None: the final
        flag alone), sent to its frontend at once, from whichever thread the model
        sends it. Its outputs travel inline, or into the client's region: a frontend's
        slot holds one response, and this request may have many."""
        item = stream.item
        req_id = item.request.req_id
        with self.io_lock:
            if self.streams.get((item.frontend, req_id)) is not stream:
                return  # ended already: the instance is stopping (_end_open_streams)
            try:
                resp = self._stream_response(item, response, final)
                payload = m.encode_payload(resp)
            except Exception as exc:  # the model's fault: the request ends with it
                log.exception("model '%s': a response could not be sent", self.s.model)
                final = True
                message = f"failed to send a response: {type(exc).__name__}: {exc}"
                payload = m.encode_payload(_error(item, Code.INTERNAL, message))
            if item.frontend not in self._gone:  # a frontend gone reads nothing more
                self._answer_frontend(item.frontend, [payload])
            if final:
                key = (item.frontend, req_id)
                self.streams.pop(key, None)
                if stream.reported_open:
                    self._ended.append(key)
                    os.eventfd_write(self._wake, 1)

    def _stream_response(self, item: m.WorkItem, response: Any, final: bool) -> m.InferResponse:
        version = self.s.version
        if response is None:
            return m.InferResponse(item.request.req_id, [], None, version, final=True, empty=True)
        if response.has_error():
            err = response.error()
            error = m.ErrorInfo(int(error_code(err.code())), str(err.message()))
            return m.InferResponse(item.request.req_id, [], error, version, final=final)
        return self._stream_result(item, response, final)

    def _stream_result(self, item: m.WorkItem, response: Any, final: bool) -> m.InferResponse:
        """A decoupled response: the outputs the request asked for that the model gave,
        inline or into the client's region."""
        given = {t.name(): t.as_numpy() for t in response.output_tensors()}
        asked = [s for s in item.request.outputs if s.name in given]
        checked = self._model_outputs(item, given, asked)
        if isinstance(checked, ServingError):
            return _error(item, checked.code, checked.message, final=final)
        specs = [s if s.region.startswith(m.CLIENT_REGION) else _inline(s) for s in asked]
        resp = self._result(item, given, specs)
        resp.final = final
        return resp

    @contextlib.contextmanager
    def _unlocked(self) -> Iterator[None]:
        """Let go of ``io_lock`` (held once, by the loop) while the model's code runs."""
        self.io_lock.release()
        try:
            yield
        finally:
            self.io_lock.acquire()

    def _model_outputs(
        self, item: m.WorkItem, outs: dict[str, Any], specs: list[m.OutputSpec] | None = None
    ) -> dict[str, Any] | ServingError:
        """A Python model's outputs for ``item`` (``specs`` of them, if not all it asked
        for), checked before they are written: each one there, as an array of its config's
        data type or one that casts to it within its kind (FP64 to FP32, say); otherwise
        the model's fault (INTERNAL)."""
        for spec in item.request.outputs if specs is None else specs:
            arr = outs.get(spec.name)
            if arr is None:
                return ServingError(
                    Code.INTERNAL, f"output '{spec.name}' was not produced by the model"
                )
            dt = datatypes.datatype(self.output_types.get(spec.name, ""))
            if dt is None or dt.numpy is None:  # BYTES: any elements, written as bytes
                continue
            got = getattr(arr, "dtype", None)
            if got is None or not np.can_cast(got, dt.numpy, casting="same_kind"):
                return ServingError(
                    Code.INTERNAL,
                    f"output '{spec.name}' of model '{self.s.model}' has data type {got}, "
                    f"which its config's {self.output_types[spec.name]} cannot hold",
                )
        return outs

    def _sequence_rows(
        self, count: int, live: list[tuple[int, m.WorkItem, dict[str, np.ndarray]]]
    ) -> tuple[list[dict[str, np.ndarray]], list[int], list[int]]:
        """A Direct batch of ``count`` rows: each live request in its slot's row, null
        rows in the others. Returns the rows' feeds, each live request's row, and the
        rows' sizes (one sample each)."""
        assert self.sequence is not None
        by_row: list[dict[str, np.ndarray] | None] = [None] * count
        for _, it, f in live:
            by_row[it.slot] = f
        if len(live) < count:  # (most batches fill every row they span: no null row)
            null = self.sequence.null_row(live[0][2])
            by_row = [f if f is not None else null for f in by_row]
        feeds = [f for f in by_row if f is not None]
        return feeds, [it.slot for _, it, _ in live], [1] * count

    def _die_after_report(self, done: m.BatchDone) -> None:
        """Fault injection for tests: the report reaches the broker, the answers never
        leave, then SIGKILL, as when a kill lands before the I/O thread wrote them."""
        log.warning("fault injection: reporting batch %d done, then dying", done.batch_id)
        sockets.send_frames(self.sock, m.encode(done))
        time.sleep(0.2)  # the report leaves
        os.kill(os.getpid(), signal.SIGKILL)

    def _destinations(self, item: m.WorkItem) -> dict[str, np.ndarray] | None:
        """Where a lone request's outputs will go, as arrays of their exact shape, for
        the backend to write them in place (no copy afterwards): those of a known shape
        that go to its client's region or to a slot of the frontend's slab, unless they
        overlap one of its inputs or another such output (the model would overwrite what
        it still reads). Below IN_PLACE_MIN_BYTES the binding costs more than the copy."""
        specs = [
            s
            for s in item.request.outputs
            if s.name in self.output_dims and s.region and s.nbytes >= IN_PLACE_MIN_BYTES
        ]  # (a classification output has no slot: it always travels inline)
        if not specs:  # most requests: nothing to look up
            return None
        clients = {c.reg_id: c for c in item.regions}
        taken = [
            host_span(t.region, t.offset, t.nbytes, clients)
            for t in item.request.inputs
            if t.data is None
        ]
        out = {}
        for spec in specs:
            dims = self.output_dims[spec.name]
            shape = [item.request.batch_size, *dims] if self.max_batch_size > 0 else dims
            dest = output_destination(
                spec.name, self.output_types[spec.name], shape, spec, self.regions, clients
            )
            if dest is None or dest.nbytes < IN_PLACE_MIN_BYTES:
                continue
            where, start, end = host_span(spec.region, spec.offset, dest.nbytes, clients)
            if not any(w == where and s < end and start < e for w, s, e in taken):
                out[spec.name] = dest
                taken.append((where, start, end))
        return out or None

    def _result(
        self,
        item: m.WorkItem,
        outs: dict[str, np.ndarray],
        specs: list[m.OutputSpec] | None = None,
    ) -> m.InferResponse:
        """Write the request's outputs (``specs``, if not those it asked for) where it
        asked; its answer (or why not)."""
        refs = []
        clients = {c.reg_id: c for c in item.regions}
        try:
            for spec in item.request.outputs if specs is None else specs:
                dtype = self.output_types.get(spec.name, "")
                arr = outs[spec.name]
                if spec.classification > 0:
                    arr = classification.top_k(
                        arr,
                        spec.classification,
                        dtype,
                        self.max_batch_size > 0,
                        self.labels.get(spec.name),
                    )
                    dtype = "BYTES"
                refs.append(
                    output_ref(spec.name, dtype, arr, spec, self.regions, clients, self.cuda)
                )
        except OutputTooLarge as exc:  # Triton's response allocator: INTERNAL
            return _error(item, Code.INTERNAL, str(exc))
        except ValueError as exc:  # a reference this instance cannot serve
            return _error(item, Code.INVALID_ARG, str(exc))
        except Exception as exc:
            return _error(item, Code.INTERNAL, f"failed to write output: {exc}")
        return m.InferResponse(item.request.req_id, refs, None, self.s.version)

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
        if self.scripting is not None:
            self.scripting.close()
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
        for key, stream in list(self.streams.items()):
            self.streams.pop(key, None)
            error = m.ErrorInfo(
                int(Code.UNAVAILABLE),
                f"Failed to process the request(s) for model instance '{self.s.instance_name}',"
                " message: the instance stopped before the model sent the final response",
            )
            resp = m.InferResponse(key[1], [], error, self.s.version)
            self._answer_frontend(stream.item.frontend, [m.encode_payload(resp)])


def _error(
    item: m.WorkItem, code: Code, message: str, names_request: bool = False, final: bool = True
) -> m.InferResponse:
    error = m.ErrorInfo(int(code), message, names_request)
    return m.InferResponse(item.request.req_id, [], error, final=final)


def _inline(spec: m.OutputSpec) -> m.OutputSpec:
    return m.OutputSpec(spec.name, classification=spec.classification)


def _thread_count(
    config: ModelConfig, backend: str, cores: list[int], may_use: int = 0, model_bytes: int = 0
) -> int:
    """Intra-op threads for the backend: what the config's parameters ask for, as that
    backend reads them (shoal.configs.backend_params), sized by `instance_threads`: one per core
    this instance owns when they ask nothing, and its core count for "the backend's
    default" (<= 0), so that the pool stays on its cores. An ONNX Runtime instance that
    may borrow idle instances' cores (``may_use``) and whose model is large enough (its
    files' ``model_bytes``) gets
    threads for them (`borrowing_threads`). Raises ConfigError, which fails the load, for
    a value Triton rejects, the first in Triton's order."""
    requested = None
    if backend == "onnxruntime":
        requested = ort_session_params(config).intra_op_threads
        return borrowing_threads(requested, cores, may_use, model_bytes)
    if backend == "pytorch":
        params = torch_thread_params(config)
        for key, value in params.ignored:
            log.warning(
                "model '%s': parameter %s '%s' is not an integer; ignored", config.name, key, value
            )
        requested = params.intra_op_threads
    return instance_threads(requested, cores)


def _files_bytes(model_file: Path) -> int:
    """The size of the files beside ``model_file`` (external weights included)."""
    folder = model_file if model_file.is_dir() else model_file.parent
    with contextlib.suppress(OSError):
        return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    return 0


_LEAKED: list[np.ndarray] = []


def _leak(slow: bool) -> None:
    """Fault injection for tests: hold on to 256 MiB more (written, so resident), as a
    model that leaks; ``slow``: then take 20 s, as one that leaks inside a long batch."""
    log.warning("fault injection: holding on to 256 MiB more%s", ", then taking 20 s" * slow)
    _LEAKED.append(np.ones(256 << 20, dtype=np.uint8))
    if slow:
        time.sleep(20)
