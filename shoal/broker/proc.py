"""The broker process: the I/O shell around ModelTable and Router.

It binds two ROUTER sockets in the runtime directory (frontends, workers), reads the
model repository to know which model versions and how many instances to expect, and
then only moves messages: requests in, batches out to idle workers. Workers answer
the frontends directly; the broker hears only that a batch is done.

Peers are siblings (under supervisord) so liveness comes from the peers' pids, which
each hello carries: a pidfd per peer turns a death into an error for every request that
peer held, at once. No request waits forever. The pidfds sit in one epoll set, itself one
entry of the loop's poll set, so that a turn of the loop costs the same with 2 peers or
200 (one worker per model instance).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import msgspec
import zmq

from shoal.broker import memory
from shoal.broker.batcher import Rejected, cuda_devices
from shoal.broker.client_regions import ClientRegions
from shoal.broker.control import Effects, ModelControl, not_in_repository
from shoal.broker.cores import CoreLender
from shoal.broker.endings import Endings
from shoal.broker.ensemble_readiness import EnsembleReadiness
from shoal.broker.models import Instance, ModelTable, ModelVersion
from shoal.broker.ordering import OrderedRelease
from shoal.broker.rate_limiter import RateLimiter
from shoal.broker.repository_sync import RepositorySync
from shoal.broker.router import Dispatch, Router
from shoal.broker.scheduler_hold import HoldCounts
from shoal.broker.sequencer import SequenceRefused
from shoal.broker.wake_timer import WakeTimer
from shoal.configs import ensemble, namespaces, rate_limits, repository
from shoal.configs.devices import gpu_count
from shoal.configs.ensemble import is_ensemble
from shoal.configs.model_control import ALL, startup_models
from shoal.configs.placement import instance_count, passive_instances
from shoal.configs.rate_limits import describe
from shoal.configs.repository_view import RepositoryView
from shoal.ipc import logs, shm, sockets
from shoal.ipc import messages as m
from shoal.ipc.errors import UNKNOWN_MODEL, Code, RequestError, ServingError, unknown_model
from shoal.ipc.lifecycle import EXIT_FATAL, raise_open_file_limit, settle_gc

log = logging.getLogger("shoal.broker")
# The longest the loop sleeps with nothing to do: its hang checks and retries run then.
# Queue delays and timeouts wake it through the timer, not through this.
_HOUSEKEEPING_MS: Final = 250
_INFER: Final = m.KINDS[m.InferRequest]


@dataclass
class BrokerSettings:
    model_repository: Path
    runtime_dir: Path
    exit_on_error: bool = True
    autocomplete: bool = True
    model_config_name: str = ""
    strict_readiness: bool = True
    execution_timeout_s: float = 300.0  # a batch running longer means a hung instance
    instance_memory_limit_mb: int = 0  # for models whose config sets none; 0: no limit
    rate_limit: str = "off"  # --rate-limit (shoal/configs/rate_limits.py)
    rate_limit_resources: list[str] = field(default_factory=list)  # --rate-limit-resource
    model_control_mode: str = "none"  # shoal.configs.model_control
    load_models: list[str] = field(default_factory=list)  # --load-model (explicit mode)
    repository_poll_secs: float = 15.0  # poll mode: how often the repository is rescanned
    # what model_repository is a view of (shoal/configs/repository_view.py); [] it is no view
    repository_locations: list[str] = field(default_factory=list)
    model_namespacing: bool = False  # qualified names (shoal/configs/namespaces.py) are served
    # why the server failed to initialize: no repository is read, the server is neither
    # live nor ready and model control is refused (Triton's FAILED_TO_INITIALIZE)
    init_error: str = ""
    expect_launcher: bool = False  # started by shoal serve (explicit/poll: it starts workers)
    cpu_lending: bool = True  # idle CPU instances lend their cores to busy ones
    # Triton's test hooks TRITONSERVER_(BACKLOG_)DELAY_SCHEDULER, read from the environment
    scheduler_hold: HoldCounts = field(default_factory=HoldCounts)


class BrokerProc:
    def __init__(self, settings: BrokerSettings) -> None:
        self.s = settings
        self.stop = False
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.fsock = sockets.router(
            self.ctx, sockets.endpoint(settings.runtime_dir, sockets.FRONTEND_SOCKET)
        )
        self.wsock = sockets.router(
            self.ctx, sockets.endpoint(settings.runtime_dir, sockets.WORKER_SOCKET)
        )
        self.table = ModelTable(settings.scheduler_hold)
        self.router = Router(self.table)
        # Every system registration holds a descriptor; the broker keeps the last 512
        # for its own sockets and for watching its peers.
        self.client_regions = ClientRegions(max(raise_open_file_limit() - 512, 0))
        self.endings = Endings(
            self.table,
            self.router,
            settings.execution_timeout_s,
            settings.instance_memory_limit_mb,
            kill=self._kill,
            ask_to_stop=self._ask_to_stop,
            supported=memory.supported(),
        )
        self._leaving: set[bytes] = set()  # frontends stopping on request (FrontendLeaving)
        self.poller = zmq.Poller()
        self.poller.register(self.fsock, zmq.POLLIN)
        self.poller.register(self.wsock, zmq.POLLIN)
        self.peer_fds = select.epoll()  # the peers' pidfds: readable once a peer exits
        self.poller.register(self.peer_fds.fileno(), zmq.POLLIN)
        self.timer = WakeTimer()  # the router's next deadline, to the microsecond
        self.lender = CoreLender() if settings.cpu_lending else None
        self.poller.register(self.timer.fileno(), zmq.POLLIN)
        self.pidfds: dict[int, tuple[str, bytes]] = {}  # fd -> (role, ident)
        self._unwatched: dict[bytes, tuple[int, str]] = {}  # pidfd_open failed: retry
        self.frontend_fds: dict[bytes, int] = {}
        self.startup_reported = False
        self.readiness = EnsembleReadiness()  # ensembles waiting for their models
        self.control = ModelControl(
            self.table,
            settings.model_repository,
            settings.runtime_dir,
            explicit=settings.model_control_mode == "explicit",
            model_config_name=settings.model_config_name,
            autocomplete=settings.autocomplete,
            poll_secs=settings.repository_poll_secs if settings.model_control_mode == "poll" else 0,
        )
        if settings.repository_locations and settings.model_control_mode != "none":
            view = RepositoryView(
                settings.repository_locations,
                settings.model_repository,
                namespacing=settings.model_namespacing,
            )
            whole = settings.model_control_mode != "explicit"
            self.control.view_sync = RepositorySync(view, whole=whole)
        # its identity once it said hello (explicit and poll modes: it starts the workers
        # of the models loaded while the server runs)
        self.launcher: bytes | None = None

    def load_repository(self) -> None:
        entries = repository.scan(
            self.s.model_repository,
            model_config_name=self.s.model_config_name,
            autocomplete_enabled=self.s.autocomplete,
            gpu_count=gpu_count(),
        )
        limits = rate_limits.for_repository(entries, self.s.rate_limit, self.s.rate_limit_resources)
        if limits is not None:
            self.router.limiter = RateLimiter(limits)
            self.control.refused = dict(limits.refused)
            log.info("rate limiter: execution_count; resources %s", describe(limits.copies))
        configs = {e.name: e.config for e in entries if not e.error and e.config is not None}
        mode, names = self.s.model_control_mode, self.s.load_models
        chosen = startup_models(entries, mode, names)
        for e in entries:
            if e.name not in chosen:
                self.control.unloaded[e.name] = {}  # never loaded: in the index by name
        self.control.named = (
            {e.name for e in entries} if ALL in names or mode != "explicit" else set(names)
        )
        for name in sorted(set(names) - {e.name for e in entries} - {ALL}):
            if mode == "explicit":  # Triton's: the model is not in the repository
                log.error("%s", not_in_repository(name))
                self.table.add_error(
                    name, f"failed to load '{name}', failed to poll from model repository"
                )
        entries = [e for e in entries if e.name in chosen]
        self.control.started_with(entries)
        if self.control.poll_secs > 0:
            self.control.start_polling(time.monotonic())
        for e in entries:
            if limits is not None and e.name in limits.refused:
                e.error = limits.refused[e.name]
            loop = ensemble.cycle(configs, e.name) if e.name in configs and not e.error else None
            if loop is not None:  # Triton's words: the start, ..., the last, the start
                ends = f"{loop[0]} -> ... -> {loop[-2]} -> {loop[0]}"
                e.error = f"circular dependency between ensembles: {ends}"
            if e.error or e.config is None:
                log.error("%s", e.error)
                self.table.add_error(e.name, e.error or "failed to load")
                continue
            if is_ensemble(e.config):
                deps = ensemble.dependencies(e.config)
                config = e.config.SerializeToString()
                self.readiness.wait(self.table.add_ensemble(e.name, e.versions, config, deps))
                continue
            count = instance_count(e.config)
            platform = e.config.platform or e.config.backend
            passive = passive_instances(e.config)
            self.table.add_model(e.name, {v: count for v in e.versions}, platform, passive)
        log.info(
            "repository %s: %d model(s) loading at start", self.s.model_repository, len(entries)
        )

    # -- loop ------------------------------------------------------------------------

    def run(self) -> int:
        # What processes killed with an earlier broker left (a worker's scripting pool,
        # shoal/workers/bls.py, is swept by the broker that watches it: none did).
        if stale := shm.sweep_stale():
            log.info("removed %d stale shared-memory segment(s)", len(stale))
        # ...and in the runtime directory: result sockets of frontends that are gone, the
        # files of loads made through an earlier broker (this one numbers loads afresh)
        if stale_files := [*sockets.sweep_stale_results(self.s.runtime_dir),
                           *self.control.sweep_files()]:  # fmt: skip
            log.info("removed %d stale file(s) of the runtime directory", len(stale_files))
        if self.s.init_error:
            self.startup_reported = True  # (nothing loads)
        else:
            self.load_repository()
        settle_gc()
        while not self.stop:
            if self.control.busy:
                self._apply(self.control.tick())
            self._settle_ensembles()
            if not self.startup_reported and self.table.startup_done():
                self.startup_reported = True
                failures = self.table.failures()
                if failures and self.s.exit_on_error:
                    log.error(
                        "exiting: %d model(s) failed to load (--exit-on-error)", len(failures)
                    )
                    # a restart would fail the same way: supervisord must not loop on it
                    return EXIT_FATAL
                log.info(
                    "startup complete: %s",
                    ", ".join(f"{s.name}/{s.version}={s.state}" for s in self.table.states())
                    or "no models",
                )
            self.timer.arm(self._next_wakeup())
            events = dict(self.poller.poll(_HOUSEKEEPING_MS))
            if self.timer.fileno() in events:
                self.timer.clear()
            # Workers first: a batch's report is read before a statistics query that
            # came in the same turn (its answers may already be with the client).
            if self.wsock in events:
                self._drain(self.wsock, self._on_worker)
            if self.fsock in events:
                self._drain(self.fsock, self._on_frontend)
            if self.peer_fds.fileno() in events:
                self._reap_peers()
            self._tick()
        # Exits signalled during the last turn are part of the stop: their requests are
        # answered, and a worker's exit is logged as stopped (see _lost).
        self._reap_peers()
        self._shutdown_workers()
        return 0

    def _next_wakeup(self) -> float | None:
        due = self.router.next_wakeup()
        if self.lender is not None and (lend := self.lender.next_wakeup()) is not None:
            due = lend if due is None else min(due, lend)
        return due

    def _repin(self, pins: dict[bytes, tuple[int, ...]]) -> None:
        """Confine every thread of each instance's worker to its cores now (a thread it
        starts later inherits its creator's). A worker that exits meanwhile is skipped."""
        for ident, cores in pins.items():
            inst = self.table.by_ident.get(ident)
            if inst is None:
                continue
            with contextlib.suppress(OSError):
                for tid in os.listdir(f"/proc/{inst.pid}/task"):
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(int(tid), cores)
            log.debug("instance %s/%d#%d runs on cores %s", inst.model, inst.version,
                      inst.index, ",".join(map(str, cores)))  # fmt: skip

    def _apply(self, effects: Effects) -> None:
        """Carry out a turn of model control (shoal/broker/control.py)."""
        if effects.start and self.launcher is not None:
            self._send(self.fsock, [self.launcher, *m.encode(m.StartWorkers(effects.start))])
        if effects.gone and self.launcher is not None:
            self._send(self.fsock, [self.launcher, *m.encode(m.GenerationsGone(effects.gone))])
        now = time.monotonic()
        for inst in effects.stop:
            shutdown = m.Shutdown("its model was unloaded or reloaded", retire=True)
            self._send(self.wsock, [inst.ident, *m.encode(shutdown)])
            self.endings.expect_exit(inst, now)  # killed if it has not exited in time
        if effects.changed:
            # (the ensembles that use them too: one may now be decoupled, or no longer)
            changed = effects.changed | self.readiness.changed(self.table, effects.changed)
            frames = m.encode(m.ModelsChanged(sorted(changed)))
            self._to_frontends(frames)
        # after the news: a frontend drops what it kept before its client hears the answer
        for frontend, reply in effects.replies:
            self._send(self.fsock, [frontend, *m.encode(reply)])
        self.readiness.wait(effects.ensembles)
        self._settle_ensembles()  # at once: an ensemble judged again is LOADING until then

    def _settle_ensembles(self) -> None:
        if self.readiness.unsettled:
            self.readiness.settle(self.table)

    def _reap_peers(self) -> None:
        for fd, _ in self.peer_fds.poll(0):
            if fd in self.pidfds:
                self._peer_died(fd)

    def _tick(self) -> None:
        now = time.monotonic()
        for ident, (pid, role) in list(self._unwatched.items()):
            del self._unwatched[ident]
            self._watch(ident, pid, role)  # back in _unwatched if it fails again
        self.endings.tick(now, self._unwatched)
        if self.control.poll_secs > 0:
            self._apply(self.control.poll(now))
        dispatches, failures = self.router.tick(now)
        for item, message in failures:
            self._fail_item(item, ServingError(Code.UNAVAILABLE, message))
        self._dispatch(dispatches)
        if self.lender is not None:
            self._repin(self.lender.tick(now))

    def _add_details(self, states: list[m.ModelState], model: str) -> None:
        """Each instance's memory (/proc reads), the memory limit, and each instance's
        turns under the rate limiter, of ``model``'s versions."""
        limiter = self.router.limiter
        for state in states:
            if state.name != model:
                continue
            if state.version >= 0:
                state.memory_limit_mb = self.endings.limit_mb(state.name, state.version)
            mv = self.table.version(state.name, state.version)
            known = {(i.index, i.pid): i for i in mv.instances.values()} if mv is not None else {}
            for info in state.instances:
                used = memory.private_memory(info.pid) if info.pid else None
                info.memory_mb = None if used is None else used // memory.MIB
                inst = known.get((info.index, info.pid))
                if limiter is not None and inst is not None:
                    info.rate_limiter = limiter.turns(inst)

    def _metrics(self, quantiles: list[float]) -> list[m.VersionMetrics]:
        """The figures of the metrics page, with each instance's memory read now."""
        versions = self.table.metrics(quantiles, time.monotonic())
        for vm in versions:
            mv = self.table.version(vm.stats.name, int(vm.stats.version))
            if mv is None:
                continue
            vm.memory_limit = self.endings.limit_mb(mv.name, mv.version) * memory.MIB
            for inst in mv.instances.values():
                used = memory.private_memory(inst.pid)
                if used is not None:
                    vm.memory[inst.index] = used
        return versions

    def _kill(self, inst: Instance) -> None:
        """SIGKILL, through its pidfd where the broker holds one (a pid number may be
        reused); its death, seen through that pidfd, answers its requests."""
        fd = next((fd for fd, (_, ident) in self.pidfds.items() if ident == inst.ident), None)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if fd is not None:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            else:
                os.kill(inst.pid, signal.SIGKILL)

    def _ask_to_stop(self, inst: Instance) -> None:
        self._send(self.wsock, [inst.ident, *m.encode(m.Shutdown("over its memory limit"))])

    def _drain(self, sock: zmq.Socket, handle: object) -> None:
        budget = 512  # frames, so one busy side cannot starve the other
        while budget > 0 and sockets.readable(sock):
            frames = sockets.recv_frames(sock, sockets.NOBLOCK)
            budget -= max(len(frames) - 2, 1)  # a frontend's message may hold many requests
            if len(frames) < 3:
                log.warning("dropped a message of %d frame(s)", len(frames))
                continue
            try:
                handle(frames)  # type: ignore[operator]
            except ValueError as exc:
                log.warning("dropped a malformed message: %s", exc)
            except Exception:
                log.exception("failed to handle a message; the broker carries on")

    def _send(self, sock: zmq.Socket, frames: list[bytes]) -> None:
        try:
            sockets.send_frames(sock, frames)
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            log.debug("peer %r is gone; message dropped", frames[0])

    def _reply_error(self, frontend: bytes, req_id: int, err: ServingError) -> None:
        """Refuse a request that was never admitted (no place in any order)."""
        info = m.ErrorInfo(int(err.code), err.message, isinstance(err, RequestError))
        resp = m.InferResponse(req_id, [], info)
        self._send(self.fsock, [frontend, m.RESULT, m.encode_payload(resp)])

    def _fail_item(
        self, item: m.WorkItem, err: ServingError, ordering: OrderedRelease | None = None
    ) -> None:
        """Answer an admitted request with an error; in its turn if it was ordered (only
        a request an instance was given has a turn: ``ordering`` is that version's)."""
        self._finished(item)
        resp = m.InferResponse(item.request.req_id, [], m.ErrorInfo(int(err.code), err.message))
        payload = m.encode_payload(resp)
        if item.seq and ordering is not None:
            released = ordering.answer(item.seq, item.frontend, payload)
        else:
            released = [(item.frontend, payload)]
        for fe, data in released:
            if data is not None:
                self._send(self.fsock, [fe, m.RESULT, data])

    # -- frontends -------------------------------------------------------------------

    def _on_frontend(self, frames: list[bytes]) -> None:
        ident, kind, payload = frames[0], frames[1], frames[2]
        if kind == _INFER:  # [ident, I, request, request, ...]: one turn of its loop
            # All of them are queued before any batch is formed: they arrived together,
            # and the first must not leave alone while the others wait for its batch.
            held: dict[int, ModelVersion] = {}
            try:
                for request in frames[2:]:
                    self._on_grouped(ident, request, held)
            finally:  # even after a bug: what was queued must not wait for the next message
                now = time.monotonic()
                for mv in held.values():
                    self._dispatch(self.router.dispatch(mv, now))
            return
        msg = m.decode(kind, payload)
        if isinstance(msg, m.ModelQuery):
            self._send(self.fsock, [ident, *m.encode(self._model_info(msg))])
        elif isinstance(msg, m.StatsQuery):
            self._send(self.fsock, [ident, *m.encode(self._stats(msg))])
        elif isinstance(msg, m.LogQuery):
            if msg.changes:
                self._change_log_settings(msg.changes)
            self._send(self.fsock, [ident, *m.encode(m.LogReply(msg.query_id, logs.current()))])
        elif isinstance(msg, m.MetricsQuery):
            reply = m.MetricsReply(msg.query_id, self._metrics(msg.quantiles))
            self._send(self.fsock, [ident, *m.encode(reply)])
        elif isinstance(msg, m.ShmRequest):
            self._send(self.fsock, [ident, *m.encode(self._on_shm(msg))])
        elif isinstance(msg, m.ServerQuery):
            ready = self.table.all_ready() and not self.control.failures()
            ready = ready or not self.s.strict_readiness
            if self.s.expect_launcher and self.control.managed and not self.control.has_launcher:
                ready = False  # the load API is not served until the launcher is here
            states = self.table.states()
            if self.control.managed:  # (mode none: every model of the repository is there)
                states = sorted([*states, *self.control.index()], key=lambda s: (s.name, s.version))
            if msg.memory_of:
                self._add_details(states, msg.memory_of)
            live = not self.s.init_error
            state = m.ServerState(msg.query_id, live, ready and live, states)
            self._send(self.fsock, [ident, *m.encode(state)])
        elif isinstance(msg, m.CacheHit):
            if (hit := self.table.version(msg.model, msg.version)) is not None:
                hit.stats.cache_hit(msg.request_ns, msg.hit_ns, time.monotonic())
        elif isinstance(msg, m.EnsembleDone):
            if (ens := self.table.version(msg.model, msg.version)) is not None:
                ens.stats.ensemble_done(msg.request_ns, msg.ok, msg.batch_size, time.monotonic())
        elif isinstance(msg, m.Cancel):
            item = self.router.cancel(ident, msg.req_id, time.monotonic())
            if item is not None:  # still queued: its answer frees the frontend's slots
                self._fail_item(item, ServingError(Code.CANCELLED, "Request was cancelled"))
            elif (runner := self.router.running(ident, msg.req_id)) is not None:
                # running, or a decoupled model still answers it: the model may look
                # (request.is_cancelled()) and stop early
                cancel = m.encode(m.Cancel(msg.req_id, ident))
                self._send(self.wsock, [runner.ident, *cancel])
        elif isinstance(msg, m.FrontendLeaving):
            if ident in self.frontend_fds or ident in self._unwatched:  # one it watches
                self._leaving.add(ident)
        elif isinstance(msg, m.ModelControl):
            if self.s.init_error:
                why = f"Server is not live: {self.s.init_error}"
                error = m.ErrorInfo(int(Code.UNAVAILABLE), why)
                self._send(self.fsock, [ident, *m.encode(m.ControlReply(msg.query_id, error))])
            else:
                self._apply(self.control.request(ident, msg))
        elif isinstance(msg, m.LauncherHello):
            if ident == sockets.LAUNCHER_IDENTITY and self.control.managed:
                if self.launcher is None:
                    log.info("launcher %d connected: models load and unload while serving", msg.pid)
                self.launcher = ident
                self.control.has_launcher = True
                self._send(self.fsock, [ident, *m.encode(self._welcome())])
        elif isinstance(msg, m.FrontendHello):
            self._watch(ident, msg.pid, "frontend")
            if msg.summaries:
                self.table.keep_summaries()
            restored = self._restore_regions(ident, msg.regions)
            self._send(self.fsock, [ident, *m.encode(self._welcome())])
            self._tell_regions(None if restored else ident)

    def _welcome(self) -> m.Welcome:
        """A (re)joining peer's welcome, with the server's log settings: the broker's,
        from its flags or changed since. After a broker restart, every process takes
        those of the new broker's flags again, as GET /v2/logging then shows."""
        return m.Welcome(os.getpid(), logs.current(), self.control.explicit)

    def _change_log_settings(self, changes: dict[str, bool | int | str]) -> None:
        """The logging extension's update (``changes`` checked by the frontend): applied
        here, then sent to every frontend and worker."""
        settings = msgspec.structs.replace(logs.current(), **changes)
        logs.apply(settings)
        log.info(
            "log settings changed: %s",
            {f: getattr(settings, f) for f in settings.__struct_fields__},
        )
        frames = m.encode(settings)
        self._to_frontends(frames)
        for ident, inst in self.table.by_ident.items():
            if inst.state != "DEAD":
                self._send(self.wsock, [ident, *frames])

    def _lookup(self, name: str, version: int) -> ModelVersion:
        """The READY version a request or query names, else Triton's error for why not
        (each reason after UNKNOWN_MODEL, as Triton's GetModel writes it)."""
        entry = self.table.models.get(name)
        if entry is None and self.s.model_namespacing:
            ambiguous = namespaces.ambiguity(name, list(self.table.models))
            if ambiguous:
                raise ServingError(Code.INVALID_ARG, ambiguous)
        if entry is None and self.control.unloaded.get(name):
            # unloaded, or its load failed (Triton's words; 404: it will not come back alone)
            raise ServingError(Code.NOT_FOUND, f"{UNKNOWN_MODEL}'{name}' has no available versions")
        if entry is None:
            raise unknown_model(name)
        if version >= 0:
            mv = entry.versions.get(version)
            if mv is None and version not in self.control.gone_versions.get(name, ()):
                raise ServingError(
                    Code.NOT_FOUND, f"{UNKNOWN_MODEL}'{name}' version {version} is not found"
                )
            if mv is None or mv.state != "READY":  # (one a reload unloaded: Triton keeps it)
                raise ServingError(
                    Code.UNAVAILABLE,
                    f"{UNKNOWN_MODEL}'{name}' version {version} is not at ready state",
                )
            return mv
        mv = self.table.resolve(name, -1)
        if mv is None:
            # 503 rather than Triton's 404: an instance may be restarting; retrying helps.
            raise ServingError(
                Code.UNAVAILABLE,
                entry.error or f"{UNKNOWN_MODEL}'{name}' has no available versions",
            )
        return mv

    def _on_grouped(self, ident: bytes, payload: bytes, held: dict[int, ModelVersion]) -> None:
        """One request of a frontend's group: whatever becomes of it, the others of the
        group still run, and it is answered unless it was queued (then its batch does)."""
        try:
            req = m.decode(_INFER, payload)
        except ValueError as exc:
            log.warning("dropped a malformed request: %s", exc)
            return
        assert isinstance(req, m.InferRequest)
        if req.hops:  # measured: its receipt here
            req.hops.append(time.monotonic_ns())
        try:
            self._on_infer(ident, req, held)
        except Exception as exc:  # a bug must not leave the request waiting for ever
            log.exception("failed to queue request %d for '%s'", req.req_id, req.model)
            if not self.router.holds(ident, req.req_id):
                internal = ServingError(Code.INTERNAL, f"{type(exc).__name__}: {exc}")
                self._reply_error(ident, req.req_id, internal)

    def _on_infer(
        self, ident: bytes, req: m.InferRequest, held: dict[int, ModelVersion] | None = None
    ) -> None:
        """Admit and queue a request. With ``held``, no batch is formed yet: its version
        joins ``held`` (by id) for the caller to dispatch once the group is queued."""
        try:
            mv, clients = self._admissible(req)
        except ServingError as err:
            self._reply_error(ident, req.req_id, err)
            return
        except Exception as exc:  # a bug must not leave the request waiting for ever
            log.exception("failed to admit request %d for '%s'", req.req_id, req.model)
            internal = ServingError(Code.INTERNAL, f"{type(exc).__name__}: {exc}")
            self._reply_error(ident, req.req_id, internal)
            return
        item = m.WorkItem(ident, req, regions=clients)
        now = time.monotonic()
        try:
            try:
                dispatches = self.router.submit(mv, item, now, dispatch=held is None)
            except Rejected:
                if held is None or held.pop(id(mv), None) is None:
                    raise
                # Full with the group's own requests, which an idle instance would
                # have taken one by one: it takes them now, then this one is queued.
                self._dispatch(self.router.dispatch(mv, now))
                dispatches = self.router.submit(mv, item, now, dispatch=False)
        except Rejected as exc:
            self._reply_error(ident, req.req_id, RequestError(Code.UNAVAILABLE, exc.message))
            return
        except SequenceRefused as exc:
            self._reply_error(ident, req.req_id, exc)
            return
        if held is not None:
            held[id(mv)] = mv
        self.client_regions.acquire(clients)
        if log.isEnabledFor(logging.DEBUG):  # --log-verbose > 0
            log.debug("request %d of %r for %s/%d admitted", req.req_id, ident, mv.name, mv.version)
        self._dispatch(dispatches)

    def _admissible(self, req: m.InferRequest) -> tuple[ModelVersion, list[m.ClientRegion]]:
        """The version that will run ``req`` and the client regions it references, or
        ServingError with Triton's reason why not. Nothing is held or queued yet."""
        mv = self._lookup(req.model, req.version)
        if mv.sequencer is not None and req.sequence_id and not req.sequence_start:
            # a sequence that began before a reload ends on the copy that holds its state
            mv = self.table.sequence_home(mv, req.sequence_id)
        req.version = mv.version  # -1 resolved once: its answer finds the same version
        if mv.ensemble is not None:  # a frontend runs its steps, never the broker
            raise ServingError(Code.INTERNAL, f"ensemble '{mv.name}' sent to the scheduler")
        clients = self.client_regions.resolve(req)
        if mv.all_passive:
            # Triton would queue it forever: no instance of a passive group is scheduled.
            raise ServingError(
                Code.UNAVAILABLE,
                f"model '{mv.name}' version {mv.version} has only passive instances, "
                "which are never sent requests",
            )
        unreachable = mv.unreachable(cuda_devices(clients))
        if unreachable is not None:
            raise unreachable
        return mv, clients

    def _finished(self, item: m.WorkItem) -> None:
        """A request ended: its hold on client regions goes (unmapped once unused)."""
        self._broadcast_released(self.client_regions.finished(item))

    def _broadcast_released(self, reg_ids: list[int]) -> None:
        if not reg_ids:
            return
        frames = m.encode(m.RegionsReleased(reg_ids))
        for worker in list(self.table.by_ident):
            self._send(self.wsock, [worker, *frames])

    def _on_shm(self, q: m.ShmRequest) -> m.ShmReply:
        reply, freed = self.client_regions.handle(q)
        self._broadcast_released(freed)
        if reply.error is None and q.op in ("register", "unregister"):
            self._tell_regions()
        return reply

    def _restore_regions(self, frontend: bytes, regions: list[m.ShmRequest]) -> int:
        """The registrations a frontend kept from an earlier broker (this one restarted):
        those missing here are registered again. Returns how many were."""
        restored, lost = self.client_regions.restore(regions)
        if restored:
            log.info("%d client shared-memory registration(s) restored from frontend %r",
                     restored, frontend)  # fmt: skip
        for why in lost:
            log.warning("client shared-memory registration %s is lost", why)
        return restored

    def _to_frontends(self, frames: list[bytes]) -> None:
        """One message to every frontend this broker knows (watched or not yet)."""
        frontends = [i for i, (_, role) in self._unwatched.items() if role == "frontend"]
        for ident in [*self.frontend_fds, *frontends]:
            self._send(self.fsock, [ident, *frames])

    def _tell_regions(self, frontend: bytes | None = None) -> None:
        """The table of client registrations, to ``frontend`` (None: to every one)."""
        frames = m.encode(m.ClientRegionsKnown(self.client_regions.known()))
        if frontend is not None:
            self._send(self.fsock, [frontend, *frames])
            return
        self._to_frontends(frames)

    def _model_info(self, q: m.ModelQuery) -> m.ModelInfo:
        try:
            mv = self._lookup(q.model, q.version)
        except ServingError as err:
            return m.ModelInfo(q.query_id, m.ErrorInfo(int(err.code), err.message), q.model)
        entry = self.table.models[q.model]
        ready = sorted(v.version for v in entry.versions.values() if v.state == "READY")
        return m.ModelInfo(
            q.query_id, None, q.model, mv.version, ready, True, mv.platform, mv.config
        )

    def _stats(self, q: m.StatsQuery) -> m.StatsReply:
        """Triton's TRITONSERVER_ServerModelStatistics: the statistics API knows only
        versions that are (here: have been) READY, and answers INVALID_ARG with its own
        wording, not the "unknown model" of the other endpoints. Without a model name
        the version is ignored."""
        if not q.model:
            return m.StatsReply(q.query_id, None, self.table.stats("", -1))
        shown = self.table.stats(q.model, -1)
        picked = [s for s in shown if q.version < 0 or s.version == str(q.version)]
        if picked:
            return m.StatsReply(q.query_id, None, picked)
        if shown:
            message = f"requested model version is not available for model '{q.model}'"
        else:
            message = f"requested model '{q.model}' is not available"
        return m.StatsReply(q.query_id, m.ErrorInfo(int(Code.INVALID_ARG), message))

    # -- workers ---------------------------------------------------------------------

    def _on_worker(self, frames: list[bytes]) -> None:
        ident, kind = frames[0], frames[1]
        if kind == m.RESULT:  # a preserve_ordering answer: [RESULT, frontend, seq, payload]
            self._on_ordered_result(ident, frames)
            return
        msg = m.decode(kind, frames[2])
        inst = self.table.by_ident.get(ident)
        if isinstance(msg, m.BatchDone):
            current = inst.in_flight if inst is not None else None
            if inst is not None and current is not None and current.batch_id == msg.batch_id:
                if self.lender is not None:
                    self.lender.done(ident, time.monotonic())
                for pos, item in enumerate(current.items):
                    if pos not in msg.open:  # an open stream still writes its outputs
                        self._finished(item)
                self._dispatch(self.router.batch_done(inst, msg, time.monotonic()))
        elif isinstance(msg, m.StreamsEnded) and inst is not None:
            for item in self.router.streams_ended(inst, msg.keys):
                self._finished(item)
        elif isinstance(msg, m.WorkerHello):
            self._on_hello(ident, msg)
        elif isinstance(msg, m.WorkerReady) and inst is not None:
            if inst.state == "LOADING":
                inst.state = "READY"
                inst.cores = list(msg.cores)
                mv = self.table.owner(inst)
                if self.lender is not None and inst.gpu is None:
                    passive = mv is not None and inst.index in mv.passive
                    if not passive:  # (never sent work: runs on every core anyway)
                        self.lender.add(ident, inst.cores, msg.threads)
                        # home first: a worker rejoining after a broker restart may
                        # still hold what the last broker lent it
                        if inst.cores:
                            self._repin({ident: tuple(sorted(inst.cores))})
                if mv is not None:
                    was_ready = mv.ever_ready
                    mv.set_config(msg.config)
                    mv.refresh_state()
                    if mv.generation == 0 and mv.ever_ready and not was_ready:
                        self._loaded_at_start(mv.name)
                log.info(
                    "instance %d of %s/%d ready (pid %d)",
                    inst.index,
                    inst.model,
                    inst.version,
                    inst.pid,
                )
            self._dispatch(self.router.instance_ready(inst, time.monotonic()))
        elif isinstance(msg, m.WorkerFailed) and inst is not None:
            log.error("%s", msg.message)
            mv = self.table.owner(inst)
            if mv is not None:
                mv.load_failed(inst, msg.message)

    def _loaded_at_start(self, name: str) -> None:
        """Triton's line once every version of a model that loads at start is READY."""
        entry = self.table.models.get(name)
        if entry is not None and all(v.ever_ready for v in entry.versions.values()):
            log.info("successfully loaded '%s'", name)

    def _on_ordered_result(self, ident: bytes, frames: list[bytes]) -> None:
        inst = self.table.by_ident.get(ident)
        if inst is None or len(frames) != 5:
            return
        mv = self.table.owner(inst)
        if mv is None or mv.ordering is None:
            return
        for fe, data in mv.ordering.answer(int(frames[3]), frames[2], frames[4]):
            if data is not None:
                self._send(self.fsock, [fe, m.RESULT, data])

    def _on_hello(self, ident: bytes, hello: m.WorkerHello) -> None:
        mv = self.table.find(hello.model, hello.version, hello.generation)
        if mv is None and self.control.managed:
            # one of a load since unloaded or replaced (restarted after a crash, say)
            log.info("worker for %s/%d (load %d) stopped: not loaded now",
                     hello.model, hello.version, hello.generation)  # fmt: skip
            retire = m.Shutdown("its model is not loaded", retire=True)
            self._send(self.wsock, [ident, *m.encode(retire)])
            return
        if mv is None:
            log.warning("worker for unexpected model %s/%d ignored", hello.model, hello.version)
            return
        if mv.ensemble is not None:  # a worker program a supervisord.conf lists by mistake
            log.warning("worker for ensemble %s/%d stopped: an ensemble has no instances",
                        hello.model, hello.version)  # fmt: skip
            self._send(self.wsock, [ident, *m.encode(m.Shutdown("an ensemble has no instances"))])
            return
        if ident not in self.table.by_ident:
            gpu = hello.gpu if hello.gpu >= 0 else None
            inst = Instance(
                ident, hello.model, hello.version, hello.instance, hello.pid, gpu=gpu,
                name=hello.name or f"{hello.model}_{hello.instance}",
                generation=hello.generation,
            )  # fmt: skip
            self.table.by_ident[ident] = inst
            mv.add_instance(inst)
            self._watch(ident, hello.pid, "worker")
        if hello.rejoin:
            # A broker restart: this instance's version was loaded under the last one.
            # It is READY once this instance is, as it was then, even if another
            # instance of it never comes back (its load failed after a crash, say).
            mv.ever_ready = True
            mv.refresh_state()
        self._send(self.wsock, [ident, *m.encode(self._welcome())])

    def _dispatch(self, dispatches: list[Dispatch]) -> None:
        for inst, batch in dispatches:
            if self.lender is not None:  # an idle instance's lent cores come back first
                self._repin(self.lender.active(inst.ident, time.monotonic()))
            sent = 0
            for item in batch.items:
                if item.request.hops:  # measured: its dispatch
                    sent = sent or time.monotonic_ns()
                    item.request.hops.append(sent)
            self._send(self.wsock, [inst.ident, *m.encode(batch)])

    # -- liveness --------------------------------------------------------------------

    def _watch(self, ident: bytes, pid: int, role: str) -> None:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            log.warning("%s pid %d is already gone", role, pid)
            self._lost(role, ident)
            return
        except OSError as exc:  # out of descriptors, say: the peer is alive; retried
            if ident not in self._unwatched:
                log.error("cannot watch %s pid %d yet (%s): retrying", role, pid, exc)
            self._unwatched[ident] = (pid, role)
            return
        self.pidfds[fd] = (role, ident)
        self.peer_fds.register(fd, select.EPOLLIN)
        if role == "frontend":
            old = self.frontend_fds.pop(ident, None)
            if old is not None:
                self._unwatch(old)
            self.frontend_fds[ident] = fd

    def _unwatch(self, fd: int) -> None:
        self.pidfds.pop(fd, None)
        self.peer_fds.unregister(fd)
        os.close(fd)

    def _peer_died(self, fd: int) -> None:
        role, ident = self.pidfds[fd]
        self._unwatch(fd)
        self._lost(role, ident)

    def _lost(self, role: str, ident: bytes) -> None:
        """A peer exited: drop its queued work, answer what it held, tell the others."""
        if role == "frontend":
            self.frontend_fds.pop(ident, None)
            for item in self.router.forget_frontend(ident, time.monotonic()):
                self._finished(item)  # queued: no place in any order yet
            if ident in self._leaving:  # it said it was stopping (SIGTERM)
                self._leaving.discard(ident)
                log.info("frontend %r stopped", ident)
            else:
                log.warning("frontend %r exited", ident)
            # Its slabs, if it could not unlink them (SIGKILL). Under shoal serve the
            # launcher does this too; under supervisord nobody else would.
            pid = sockets.frontend_pid(ident)
            if pid is not None and (removed := shm.sweep_stale({pid})):
                log.info("removed %d shared-memory slab(s) of the exited frontend", len(removed))
            with contextlib.suppress(OSError, ValueError):  # its result socket's file, too
                endpoint = sockets.result_endpoint(self.s.runtime_dir, ident)
                Path(endpoint.removeprefix("ipc://")).unlink()
            gone = m.encode(m.FrontendGone(ident))
            for worker in list(self.table.by_ident):
                self._send(self.wsock, [worker, *gone])
            return
        inst = self.table.by_ident.pop(ident, None)
        if inst is None:
            return
        if self.lender is not None:
            self._repin(self.lender.remove(ident, time.monotonic()))
        why, ended = self.endings.pop(ident)
        if inst.retiring:  # told to stop for good (unloaded, or replaced by a reload)
            ended = "stopped: its model was unloaded or reloaded"
        # An instance that reported its load failed is not restarted: no unasked exit;
        # nor is one that was told to stop for good.
        counted = (why != "crash" or inst.state != "DEAD") and not inst.retiring
        # When the broker is stopping (SIGTERM), the workers are being stopped with it
        # (the launcher signals them together): an exit is the stop, not a fault.
        log.log(
            logging.INFO if self.stop or inst.retiring else logging.ERROR,
            "instance %d of %s/%d (pid %d) %s", inst.index, inst.model, inst.version, inst.pid,
            "stopped" if self.stop else ended,
        )  # fmt: skip
        was_loading = inst.state == "LOADING"
        ran = {id(item) for item in inst.in_flight.items} if inst.in_flight else set()
        ran |= {id(item) for item in inst.streams.values()}  # a decoupled model's, open
        failed, dispatches = self.router.instance_lost(inst, time.monotonic())
        version = self.table.owner(inst)
        if version is not None:
            if counted and not self.stop:
                version.exits[why] = version.exits.get(why, 0) + 1
            version.instances.pop(ident, None)
            if was_loading:
                version.load_failed(inst, f"instance {inst.index} {ended} while loading")
        err = ServingError(
            Code.UNAVAILABLE,
            f"Failed to process the request(s) for model instance '{inst.name}', "
            f"message: the instance's worker process (pid {inst.pid}) {ended}",
        )
        # Those still queued that no instance left can run (it was the model's last, or
        # the last on the GPU their CUDA memory is on): no instance ever saw them.
        orphaned = ServingError(
            Code.UNAVAILABLE,
            f"Failed to process the request(s) for model '{inst.model}' version "
            f"{inst.version}, message: instance '{inst.name}' (pid {inst.pid}) {ended} "
            "and no instance left can run them",
        )
        # Those queued for a sequence that ran on it (shoal/broker/sequencer.py): its state is gone.
        sequence_lost = ServingError(
            Code.UNAVAILABLE,
            f"Failed to process the request(s) for model '{inst.model}' version "
            f"{inst.version}, message: instance '{inst.name}' (pid {inst.pid}) {ended}, and "
            "with it the state of the sequence they belong to",
        )
        siblings = (
            version is not None and version.sequencer is not None and bool(version.schedulable())
        )
        ordering = version.ordering if version is not None else None
        for item in failed:
            if id(item) in ran:
                self._fail_item(item, err, ordering)
            elif siblings:
                self._fail_item(item, sequence_lost, ordering)
            else:
                self._fail_item(item, orphaned, ordering)
        error = m.ErrorInfo(int(err.code), err.message)
        for frontend, req_ids in self.router.unconfirmed(inst, time.monotonic()).items():
            self._send(self.fsock, [frontend, *m.encode(m.Unconfirmed(req_ids, error))])
        self._dispatch(dispatches)

    def _shutdown_workers(self) -> None:
        for ident in list(self.table.by_ident):
            self._send(self.wsock, [ident, *m.encode(m.Shutdown("broker stopping"))])

    def close(self) -> None:
        if self.control.view_sync is not None:
            self.control.view_sync.close()
        for fd in list(self.pidfds):
            self._unwatch(fd)
        self.peer_fds.close()
        self.timer.close()
        self.fsock.close(0)
        self.wsock.close(0)
        self.client_regions.table.close()
