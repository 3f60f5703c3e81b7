"""The broker process: the I/O shell around ModelTable and Router, and the other pure cores
(queries.py, endings.py, control.py, startup.py, worker_hello.py, ...); its sends go
through outbox.py, its peers' lives through peers.py.

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
import time
from pathlib import Path
from typing import Final

import msgspec
import zmq

from shoal.broker import memory, worker_hello
from shoal.broker.batcher import Rejected
from shoal.broker.client_shm_requests import ClientRegions
from shoal.broker.control import Effects
from shoal.broker.cores import CoreLender
from shoal.broker.endings import Endings
from shoal.broker.ensemble_readiness import EnsembleReadiness
from shoal.broker.frontend_watch import FrontendWatch
from shoal.broker.model_files import read_model_file
from shoal.broker.models import Instance, ModelTable, ModelVersion
from shoal.broker.outbox import Outbox
from shoal.broker.peers import PeerWatch, pin_threads
from shoal.broker.queries import Queries
from shoal.broker.router import Dispatch, Router
from shoal.broker.sequencer import SequenceRefused
from shoal.broker.startup import BrokerSettings, load_repository, model_control
from shoal.broker.wake_timer import WakeTimer
from shoal.ipc import custom_metrics, logs, shm, sockets
from shoal.ipc import messages as m
from shoal.ipc.errors import Code, RequestError, ServingError
from shoal.ipc.event_wait import EventWait
from shoal.ipc.lifecycle import EXIT_FATAL, raise_open_file_limit, settle_gc

log = logging.getLogger("shoal.broker")
# The longest the loop sleeps with nothing to do: its hang checks and retries run then.
# Queue delays and timeouts wake it through the timer, not through this.
_HOUSEKEEPING_MS: Final = 250
# Under load the loop turns once a message or two: its checks of hung instances, late
# stops, silent frontends and unwatched peers run at most this often, not every turn.
_HOUSEKEEPING_EVERY_S: Final = 0.01
_INFER: Final = m.KINDS[m.InferRequest]


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
        self.peers = PeerWatch(self._lost)  # the peers' pidfds: a death is seen at once
        self.frontend_watch = FrontendWatch(settings.frontend_silence_s)
        self.endings = Endings(
            self.table,
            self.router,
            settings.execution_timeout_s,
            settings.instance_memory_limit_mb,
            kill=self.peers.kill,
            ask_to_stop=self._ask_to_stop,
            supported=memory.supported(),
        )
        self.out = Outbox(self.fsock, self.wsock, self.table, self.client_regions, self.peers)
        self._leaving: set[bytes] = set()  # frontends stopping on request (FrontendLeaving)
        self.poller = EventWait()
        self.poller.register(self.fsock, zmq.POLLIN)
        self.poller.register(self.wsock, zmq.POLLIN)
        self.poller.register(self.peers.fileno(), zmq.POLLIN)
        self.timer = WakeTimer()  # the router's next deadline, to the microsecond
        self.lender = CoreLender() if settings.cpu_lending else None
        self.poller.register(self.timer.fileno(), zmq.POLLIN)
        self.startup_reported = False
        self._housekeeping_at = 0.0  # (monotonic: long past, the first turn does it)
        self.readiness = EnsembleReadiness()  # ensembles waiting for their models
        self.control = model_control(settings, self.table)
        self.queries = Queries(
            self.table,
            self.control,
            self.router,
            self.endings,
            self.client_regions,
            settings.model_namespacing,
        )
        # its identity once it said hello (explicit and poll modes: it starts the workers
        # of the models loaded while the server runs)
        self.launcher: bytes | None = None

    def load_repository(self) -> None:
        load_repository(self.s, self.table, self.router, self.control, self.readiness)

    # -- loop ------------------------------------------------------------------------

    def run(self) -> int:
        # What processes killed with an earlier broker left (a worker's scripting pool,
        # shoal/workers/bls.py, is swept by the broker that watches it: none did).
        if stale := shm.sweep_stale():
            log.info("removed %d stale shared-memory segment(s)", len(stale))
        # ...and in the runtime directory: result sockets of frontends that are gone, the
        # files of loads made through an earlier broker (this one numbers loads afresh)
        if stale_files := [*sockets.sweep_stale_results(self.s.runtime_dir),
                           *self.control.sweep_files(),
                           *custom_metrics.sweep(self.s.runtime_dir)]:  # fmt: skip
            log.info("removed %d stale file(s) of the runtime directory", len(stale_files))
        # ...and the frontends running already, each judged from now: one stuck before
        # this broker started would never greet it, nor be seen stuck otherwise
        for ident, pid in sockets.running_frontends(self.s.runtime_dir):
            self.peers.watch(ident, pid, "frontend")
            self.frontend_watch.expect(ident, time.monotonic())
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
            fired = self.timer.fileno() in events
            if fired:
                self.timer.clear()
            # Workers first: a batch's report is read before a statistics query that
            # came in the same turn (its answers may already be with the client).
            if self.wsock in events:
                self._drain(self.wsock, self._on_worker)
            if self.fsock in events:
                self._drain(self.fsock, self._on_frontend)
            if self.peers.fileno() in events:
                self.peers.reap()
            self._tick(fired or not events)
        # Exits signalled during the last turn are part of the stop: their requests are
        # answered, and a worker's exit is logged as stopped (see _lost).
        self.peers.reap()
        self._shutdown_workers()
        return 0

    def _next_wakeup(self) -> float | None:
        due = self.router.next_wakeup()
        if self.lender is not None and (lend := self.lender.next_wakeup()) is not None:
            due = lend if due is None else min(due, lend)
        return due

    def _repin(self, pins: dict[bytes, tuple[int, ...]]) -> None:
        """Confine each instance's worker to its cores now; one that exited is skipped."""
        for ident, cores in pins.items():
            inst = self.table.by_ident.get(ident)
            if inst is not None:
                pin_threads(inst.pid, cores)
                log.debug("instance %s/%d#%d runs on cores %s", inst.model, inst.version,
                          inst.index, ",".join(map(str, cores)))  # fmt: skip

    def _apply(self, effects: Effects) -> None:
        """Carry out a turn of model control (shoal/broker/control.py)."""
        if effects.start and self.launcher is not None:
            self.out.to_frontend(self.launcher, m.StartWorkers(effects.start))
        if effects.gone and self.launcher is not None:
            self.out.to_frontend(self.launcher, m.GenerationsGone(effects.gone))
        now = time.monotonic()
        for inst in effects.stop:
            shutdown = m.Shutdown("its model was unloaded or reloaded", retire=True)
            self.out.to_worker(inst.ident, shutdown)
            self.endings.expect_exit(inst, now)  # killed if it has not exited in time
        if effects.changed:
            # (the ensembles that use them too: one may now be decoupled, or no longer)
            changed = effects.changed | self.readiness.changed(self.table, effects.changed)
            frames = m.encode(m.ModelsChanged(sorted(changed)))
            self.out.to_frontends(frames)
        # after the news: a frontend drops what it kept before its client hears the answer
        for frontend, reply in effects.replies:
            self.out.to_frontend(frontend, reply)
        self.readiness.wait(effects.ensembles)
        self._settle_ensembles()  # at once: an ensemble judged again is LOADING until then

    def _settle_ensembles(self) -> None:
        if self.readiness.unsettled:
            self.readiness.settle(self.table)

    def _tick(self, woken: bool) -> None:
        """What is due by the clock: the router's queue delays and timeouts when the timer
        armed for them fired (``woken``) or their time came, and every
        _HOUSEKEEPING_EVERY_S the router's other expiries and the checks that nothing
        stands stuck (under load the loop turns once a message: not each turn)."""
        now = time.monotonic()
        housekeeping = woken or now >= self._housekeeping_at
        if housekeeping or self.router.due(now):
            dispatches, failures = self.router.tick(now)
            for item, message in failures:
                self.out.fail_item(item, ServingError(Code.UNAVAILABLE, message))
            self._dispatch(dispatches)
        if not housekeeping:
            return
        self._housekeeping_at = now + _HOUSEKEEPING_EVERY_S
        self.peers.retry()
        self.endings.tick(now, self.peers.unwatched)
        if not self.stop:
            for frontend in self.frontend_watch.stuck(now):
                self._kill_frontend(frontend)
        if self.control.poll_secs > 0:
            self._apply(self.control.poll(now))
        if self.lender is not None:
            self._repin(self.lender.tick(now))

    def _kill_frontend(self, ident: bytes) -> None:
        """SIGKILL a frontend silent too long (shoal/broker/frontend_watch.py): stuck, it
        holds its ports and its clients. Its death, seen through its pidfd, is then that
        of any frontend: its requests fail here, and whoever runs it starts another."""
        log.error("frontend %r (pid %s) sent nothing for %.0fs: stuck; killing it",
                  ident, sockets.frontend_pid(ident), self.frontend_watch.silent_s)  # fmt: skip
        self.peers.kill_frontend(ident)

    def _ask_to_stop(self, inst: Instance) -> None:
        self.out.to_worker(inst.ident, m.Shutdown("over its memory limit"))

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

    # -- frontends -------------------------------------------------------------------

    def _on_frontend(self, frames: list[bytes]) -> None:
        ident, kind, payload = frames[0], frames[1], frames[2]
        self.frontend_watch.heard(ident, time.monotonic())
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
        reply = self._answer(msg)
        if reply is not None:
            self.out.to_frontend(ident, reply)
        elif isinstance(msg, m.CacheHit):
            if (hit := self.table.version(msg.model, msg.version)) is not None:
                hit.stats.cache_hit(msg.request_ns, msg.hit_ns, time.monotonic())
        elif isinstance(msg, m.EnsembleDone):
            if (ens := self.table.version(msg.model, msg.version)) is not None:
                ens.stats.ensemble_done(msg.request_ns, msg.ok, msg.batch_size, time.monotonic())
        elif isinstance(msg, m.Cancel):
            item = self.router.cancel(ident, msg.req_id, time.monotonic())
            if item is not None:  # still queued: its answer frees the frontend's slots
                self.out.fail_item(item, ServingError(Code.CANCELLED, "Request was cancelled"))
            elif (runner := self.router.running(ident, msg.req_id)) is not None:
                # running, or a decoupled model still answers it: the model may look
                # (request.is_cancelled()) and stop early
                cancel = m.encode(m.Cancel(msg.req_id, ident))
                self.out.send(self.wsock, [runner.ident, *cancel])
        elif isinstance(msg, m.FrontendLeaving):
            if self.peers.knows(ident):  # one it watches
                self._leaving.add(ident)
        elif isinstance(msg, m.ModelControl):
            if self.s.init_error:
                why = f"Server is not live: {self.s.init_error}"
                error = m.ErrorInfo(int(Code.UNAVAILABLE), why)
                self.out.to_frontend(ident, m.ControlReply(msg.query_id, error))
            else:
                self._apply(self.control.request(ident, msg))
        elif isinstance(msg, m.LauncherHello):
            if ident == sockets.LAUNCHER_IDENTITY and self.control.managed:
                if self.launcher is None:
                    log.info("launcher %d connected: models load and unload while serving", msg.pid)
                self.launcher = ident
                self.control.has_launcher = True
                self.out.to_frontend(ident, self._welcome())
        elif isinstance(msg, m.FrontendHello):
            self.peers.watch(ident, msg.pid, "frontend")
            self.frontend_watch.expect(ident, time.monotonic())
            if msg.summaries:
                self.table.keep_summaries()
            restored = self._restore_regions(ident, msg.regions)
            self.out.to_frontend(ident, self._welcome())
            self.out.tell_regions(None if restored else ident)

    def _answer(self, msg: msgspec.Struct) -> msgspec.Struct | None:
        """The reply to a frontend's query (None: ``msg`` is no query)."""
        if isinstance(msg, m.ModelQuery):
            return self.queries.model_info(msg)
        if isinstance(msg, m.StatsQuery):
            return self.queries.stats(msg)
        if isinstance(msg, m.ModelFileQuery):
            entry = self.control.loaded.get(msg.model)
            return read_model_file(entry.path if entry is not None else None, msg)
        if isinstance(msg, m.LogQuery):
            if msg.changes:
                self._change_log_settings(msg.changes)
            return m.LogReply(msg.query_id, logs.current())
        if isinstance(msg, m.TraceQuery):
            return self._trace_query(msg)
        if isinstance(msg, m.MetricsQuery):
            return m.MetricsReply(
                msg.query_id, self.queries.metrics(msg.quantiles, time.monotonic())
            )
        if isinstance(msg, m.ShmRequest):
            return self._on_shm(msg)
        if isinstance(msg, m.ServerQuery):
            state = self.queries.server_state(
                msg, self.s.strict_readiness, self.s.expect_launcher, self.startup_reported
            )
            if self.s.init_error:  # neither live nor ready (Triton's FAILED_TO_INITIALIZE)
                state.live = state.ready = False
            return state
        return None

    def _welcome(self) -> m.Welcome:
        """A (re)joining peer's welcome, with the server's log settings: the broker's,
        from its flags or changed since. After a broker restart, every process takes
        those of the new broker's flags again, as GET /v2/logging then shows."""
        return m.Welcome(os.getpid(), logs.current(), self.control.explicit, self.s.trace.table())

    def _trace_query(self, msg: m.TraceQuery) -> m.TraceReply:
        """The trace extension (shoal/configs/trace_settings.py): a change goes to every
        frontend before this answer goes to the one that asked."""
        t = self.s.trace
        if msg.changes:
            try:
                t.update(msg.model, msg.changes)
            except ServingError as err:
                return m.TraceReply(msg.query_id, error=m.ErrorInfo(int(err.code), str(err)))
            self.out.to_frontends(m.encode(t.table()))
        return m.TraceReply(msg.query_id, t.get(msg.model), t.mode, t.options)

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
        self.out.to_frontends(frames)
        for ident, inst in self.table.by_ident.items():
            if inst.state != "DEAD":
                self.out.send(self.wsock, [ident, *frames])

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
                self.out.reply_error(ident, req.req_id, internal)

    def _on_infer(
        self, ident: bytes, req: m.InferRequest, held: dict[int, ModelVersion] | None = None
    ) -> None:
        """Admit and queue a request. With ``held``, no batch is formed yet: its version
        joins ``held`` (by id) for the caller to dispatch once the group is queued."""
        try:
            mv, clients = self.queries.admissible(req)
        except ServingError as err:
            self.out.reply_error(ident, req.req_id, err)
            return
        except Exception as exc:  # a bug must not leave the request waiting for ever
            log.exception("failed to admit request %d for '%s'", req.req_id, req.model)
            internal = ServingError(Code.INTERNAL, f"{type(exc).__name__}: {exc}")
            self.out.reply_error(ident, req.req_id, internal)
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
            self.out.reply_error(ident, req.req_id, RequestError(Code.UNAVAILABLE, exc.message))
            return
        except SequenceRefused as exc:
            self.out.reply_error(ident, req.req_id, exc)
            return
        if held is not None:
            held[id(mv)] = mv
        self.client_regions.acquire(clients)
        if log.isEnabledFor(logging.DEBUG):  # --log-verbose > 0
            log.debug("request %d of %r for %s/%d admitted", req.req_id, ident, mv.name, mv.version)
        self._dispatch(dispatches)

    def _on_shm(self, q: m.ShmRequest) -> m.ShmReply:
        reply, freed = self.client_regions.handle(q)
        self.out.released(freed)
        if reply.error is None and q.op in ("register", "unregister"):
            self.out.tell_regions()
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
                        self.out.finished(item)
                self._dispatch(self.router.batch_done(inst, msg, time.monotonic()))
        elif isinstance(msg, m.RerunDone) and inst is not None:
            if (mv := self.table.owner(inst)) is not None:
                mv.stats.reran(msg, time.monotonic())
        elif isinstance(msg, m.StreamsEnded) and inst is not None:
            for item in self.router.streams_ended(inst, msg.keys):
                self.out.finished(item)
        elif isinstance(msg, m.WorkerHello):
            self._on_hello(ident, msg)
        elif isinstance(msg, m.WorkerReady) and inst is not None:
            if inst.state == "LOADING":
                self._instance_ready(inst, msg)
            self._dispatch(self.router.instance_ready(inst, time.monotonic()))
        elif isinstance(msg, m.WorkerFailed) and inst is not None:
            log.error("%s", msg.message)
            mv = self.table.owner(inst)
            if mv is not None:
                mv.load_failed(inst, msg.message)

    def _instance_ready(self, inst: Instance, msg: m.WorkerReady) -> None:
        """A LOADING instance loaded its model: READY, on its cores (lent while idle)."""
        inst.state = "READY"
        inst.cores = list(msg.cores)
        inst.checks_ready = msg.checks_ready
        mv = self.table.owner(inst)
        if self.lender is not None and inst.gpu is None:
            passive = mv is not None and inst.index in mv.passive
            if not passive:  # (never sent work: runs on every core anyway)
                self.lender.add(inst.ident, inst.cores, msg.threads)
                # home first: a worker rejoining after a broker restart may still hold
                # what the last broker lent it
                if inst.cores:
                    self._repin({inst.ident: tuple(sorted(inst.cores))})
        if mv is not None:
            was_ready = mv.ever_ready
            mv.set_config(msg.config)
            mv.refresh_state()
            if mv.generation == 0 and mv.ever_ready and not was_ready:
                self._loaded_at_start(mv.name)
        log.info("instance %d of %s/%d ready (pid %d)",
                 inst.index, inst.model, inst.version, inst.pid)  # fmt: skip

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
                self.out.send(self.fsock, [fe, m.RESULT, data])

    def _on_hello(self, ident: bytes, hello: m.WorkerHello) -> None:
        """A worker said hello (shoal/broker/worker_hello.py); its pid is watched."""
        managed = self.control.managed
        told = worker_hello.greet(self.table, managed, ident, hello, self.peers.watch)
        if told == "welcome":
            self.out.to_worker(ident, self._welcome())
        elif told != "ignore":
            self.out.to_worker(ident, told)

    def _dispatch(self, dispatches: list[Dispatch]) -> None:
        for inst, batch in dispatches:
            if self.lender is not None:  # an idle instance's lent cores come back first
                self._repin(self.lender.active(inst.ident, time.monotonic()))
            sent = 0
            for item in batch.items:
                if item.request.hops:  # measured: its dispatch
                    sent = sent or time.monotonic_ns()
                    item.request.hops.append(sent)
            self.out.send(self.wsock, [inst.ident, *m.encode(batch)])

    # -- liveness --------------------------------------------------------------------

    def _lost(self, role: str, ident: bytes) -> None:
        """A peer exited: drop its queued work, answer what it held, tell the others."""
        if role == "frontend":
            self.peers.frontend_lost(ident)
            self.frontend_watch.forget(ident)
            for item in self.router.forget_frontend(ident, time.monotonic()):
                self.out.finished(item)  # queued: no place in any order yet
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
                Path(sockets.result_path(self.s.runtime_dir, ident)).unlink()
            self.out.to_workers(m.encode(m.FrontendGone(ident)))
            return
        inst = self.table.by_ident.pop(ident, None)
        if inst is None:
            return
        if self.lender is not None:
            self._repin(self.lender.remove(ident, time.monotonic()))
        # its Python model's metrics, if it could not remove them (SIGKILL)
        custom_metrics.snapshot_path(self.s.runtime_dir, inst.pid).unlink(missing_ok=True)
        loss = self.endings.lost(inst, self.stop, time.monotonic())
        for item, err in loss.answers:
            self.out.fail_item(item, err, loss.ordering)
        error = m.ErrorInfo(int(loss.error.code), loss.error.message)
        for frontend, req_ids in self.router.unconfirmed(inst, time.monotonic()).items():
            self.out.to_frontend(frontend, m.Unconfirmed(req_ids, error))
        self._dispatch(loss.dispatches)

    def _shutdown_workers(self) -> None:
        self.out.to_workers(m.encode(m.Shutdown("broker stopping")))

    def close(self) -> None:
        if self.control.view_sync is not None:
            self.control.view_sync.close()
        self.peers.close()
        self.timer.close()
        self.poller.close()
        self.fsock.close(0)
        self.wsock.close(0)
        self.client_regions.table.close()
