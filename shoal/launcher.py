"""``shoal serve``: starts the broker, the frontends and one worker per model instance,
watches them, restarts any that dies, and stops them in order.

Each child is its own program (``python -m shoal.broker|frontend|workers``), exactly as
supervisord would run them, so the two deployments share every code path. Children
die with the launcher (PDEATHSIG). A child that exits is restarted after a backoff
(shoal/restart_policy.py), the broker too: the frontends and workers that keep running
rejoin the new one; a broker that stops answering without exiting is killed first
(shoal/broker_watch.py), and a frontend that stops talking to the broker is killed by
the broker (shoal/broker/frontend_watch.py), then restarted here as any dead frontend.
A broker or frontend that keeps dying soon after each start stops the server (a crash
loop); so does one that exits saying it cannot run (EXIT_FATAL).
Stop order: frontends first (stop accepting, drain until the exit timeout), then the
broker and the workers, then a sweep of any shared memory a killed child left in
/dev/shm.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from shoal import repository_cache, restart_policy
from shoal.broker_watch import BrokerWatch
from shoal.configs.repository_view import RepositoryError
from shoal.ipc import messages as m
from shoal.ipc import shm, sockets
from shoal.ipc.lifecycle import EXIT_FATAL, EXIT_RETIRED
from shoal.ipc.messages import LogSettings, WorkerSpec
from shoal.ipc.sockets import ensure_runtime_dir
from shoal.role_argv import RoleArgv

log = logging.getLogger("shoal.serve")


@dataclass
class ServeSettings:
    model_repository: Path
    # why the server cannot serve (a --model-repository that is no folder, with
    # --exit-on-error=false): it runs, not live and not ready, with no models, as Triton's
    # server that failed to initialize; "" when it serves
    init_error: str = ""
    # what model_repository is a view of (several repositories, object storage): the
    # launcher fetches it before the other roles start, and removes it at exit
    repository_locations: list[str] = field(default_factory=list)
    model_namespacing: bool = False  # a name in several repositories: one per repository
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    allow_http: bool = True
    grpc_port: int = 8001
    allow_grpc: bool = True
    grpc_address: str = "0.0.0.0"
    reuse_grpc_port: bool = False
    allow_client_shm: bool = False
    response_cache_bytes: int = 0  # --cache-config's size, shared by the frontends
    allow_metrics: bool = True
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    metrics_interval_ms: int = 2000
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True
    metrics_config: list[str] = field(default_factory=list)  # --metrics-config values
    trace_flags: list[str] = field(default_factory=list)  # the --trace-* flags, as given
    http_restricted_api: list[str] = field(default_factory=list)
    grpc_restricted_protocol: list[str] = field(default_factory=list)
    grpc_flags: list[str] = field(default_factory=list)  # channel and TLS flags, as given
    connection_flags: list[str] = field(default_factory=list)  # caps and deadlines, as given
    server_id: str = "triton"
    log: LogSettings = field(default_factory=LogSettings)
    exit_on_error: bool = True
    strict_readiness: bool = True
    autocomplete: bool = True
    model_config_name: str = ""
    model_control_mode: str = "none"  # shoal.configs.model_control
    load_models: list[str] = field(default_factory=list)  # --load-model (explicit mode)
    repository_poll_secs: float = 15.0  # poll mode
    default_max_batch_size: int = 4
    load_retries: int = 0  # --model-load-retry-count: more tries of a failed model load
    exit_timeout_secs: float = 30.0
    broker_silence_secs: float = 30.0  # a broker silent this long is stuck (0: never)
    frontend_silence_secs: float = 30.0  # the broker kills a frontend silent this long (0: never)
    http_max_input_size: int = 64 * 1024 * 1024
    frontend_processes: int = 1
    execution_timeout_secs: float = 300.0
    instance_memory_limit_mb: int = 0
    cpu_lending: bool = True  # --cpu-lending
    rate_limit: str = "off"  # --rate-limit
    rate_limit_resources: list[str] = field(default_factory=list)  # --rate-limit-resource
    reuse_http_port: bool = False
    runtime_dir: str = ""
    extra_frontend_args: list[str] = field(default_factory=list)


@dataclass
class Child:
    role: str
    argv: list[str]
    proc: subprocess.Popen[bytes]
    pidfd: int
    restarts: int = 0  # its quick exits in a row before this start (restart_policy)
    started: float = field(default_factory=time.monotonic)
    generation: int = 0  # a worker's load (model control); 0: started with the server


class Launcher:
    def __init__(self, s: ServeSettings) -> None:
        self.s = s
        self.stop = False
        self.children: list[Child] = []
        self.restarts: list[tuple[float, str, list[str], int]] = []  # (due, role, argv, count)
        self.own_runtime_dir = not s.runtime_dir
        self.runtime_dir = ensure_runtime_dir(s.runtime_dir or None)
        # To the broker: pings (a stuck broker is killed), and in model control modes its
        # requests for the workers of the models loaded through the API (in mode none
        # every worker starts here, at once).
        self.managed = s.model_control_mode in ("explicit", "poll")
        self.ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self.sock: zmq.Socket[bytes] | None = None
        self.broker_watch = BrokerWatch(silent_s=s.broker_silence_secs or float("inf"))
        self.welcomed = False
        self.last_hello = 0.0
        self.gone_generations: set[int] = set()  # loads whose workers must not run again
        self.ended_loads: set[int] = set()  # pids of workers of a lost broker's loads
        # pids of start-up workers (no load of the API) running when a broker was lost: one
        # of them may have been retired by it, and the next broker waits for it
        self.outlived_broker: set[int] = set()

    # -- argv of each role (shoal.role_argv) -----------------------------------------

    def _argv(self) -> RoleArgv:
        return RoleArgv(self.s, self.runtime_dir, os.getpid())

    def broker_argv(self) -> list[str]:
        return self._argv().broker()

    def frontend_argv(self, index: int) -> list[str]:
        return self._argv().frontend(index)

    def worker_argvs(self) -> list[tuple[str, list[str]]]:
        """(instance name, argv) of every worker the repository asks for at start, placed
        on its own cores or GPU (see shoal.configs.placement)."""
        return self._argv().workers()

    def worker_argv(self, w: WorkerSpec) -> tuple[str, list[str]]:
        """(instance name, argv) of one worker: placed, and of its load (generation)."""
        return self._argv().worker(w)

    # -- process management ----------------------------------------------------------

    def _spawn(self, role: str, argv: list[str], restarts: int = 0) -> Child:
        # Own process group: a terminal's Ctrl-C reaches the launcher alone, which then
        # stops the children in order; PDEATHSIG still ties them to the launcher.
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, process_group=0)
        child = Child(
            role, argv, proc, os.pidfd_open(proc.pid), restarts, generation=_generation(argv)
        )
        self.children.append(child)
        if role == "broker":
            self.broker_watch.started()
        log.debug("started %s (pid %d)", role, proc.pid)
        return child

    def run(self) -> int:
        removed = shm.sweep_stale()
        if removed:
            log.info("removed %d stale shared-memory segment(s) of dead processes", len(removed))
        if self.s.repository_locations and not self._prepare_view():
            return 1
        self._spawn("broker", self.broker_argv())
        for name, argv in self.worker_argvs():
            self._spawn(f"worker {name}", argv)
        for i in range(self.s.frontend_processes):
            self._spawn(f"frontend#{i}", self.frontend_argv(i))
        self.ctx = zmq.Context()
        addr = sockets.endpoint(self.runtime_dir, sockets.FRONTEND_SOCKET)
        self.sock = sockets.dealer(self.ctx, addr, sockets.LAUNCHER_IDENTITY)
        return self._watch()

    def _prepare_view(self) -> bool:
        """Fetch the repositories' view (whether the server can start)."""
        for stale in repository_cache.sweep_stale():
            log.info("removed the model cache of a server that is gone: %s", stale)
        try:
            repository_cache.prepare(
                self.s.repository_locations,
                self.s.model_repository,
                mode=self.s.model_control_mode,
                load_models=self.s.load_models,
                model_config_name=self.s.model_config_name,
                namespacing=self.s.model_namespacing,
            )
        except RepositoryError as err:
            log.error("error: creating server: Internal - %s", err.message)
            return False
        return True

    def _watch(self) -> int:
        while not self.stop:
            fds = [c.pidfd for c in self.children]
            if self.sock is not None:
                # ZMQ_FD is edge-triggered: every wake-up (and every turn) reads all
                fds.append(self.sock.FD)
            now = time.monotonic()
            for due, role, argv, count in [r for r in self.restarts if r[0] <= now]:
                self.restarts.remove((due, role, argv, count))
                self._spawn(role, argv, count)
                if role == "broker":
                    self._start_missing_workers()
            if self.sock is not None:
                self._talk_to_broker(now)
            wait = min([1.0 if self.welcomed or not self.managed else 0.5,
                        *(r[0] - now for r in self.restarts)])  # fmt: skip
            try:
                ready, _, _ = select.select(fds, [], [], max(wait, 0.0))
            except InterruptedError:
                continue
            if self.sock is not None:
                self._from_broker()
            for fd in ready:
                child = next((c for c in self.children if c.pidfd == fd), None)
                if child is None:
                    continue
                code = self._reap(child)
                if code is not None:
                    return code
        return 0

    def _talk_to_broker(self, now: float) -> None:
        """Greet the broker (model control modes), ping it, and kill it if it is stuck:
        it is then restarted as any broker that died."""
        assert self.sock is not None
        with contextlib.suppress(zmq.Again):  # (a queue that is full: sent next time)
            if self.managed and not self.welcomed and now - self.last_hello > 0.5:
                self.sock.send_multipart(m.encode(m.LauncherHello(os.getpid())), zmq.NOBLOCK)
                self.last_hello = now
            if self.broker_watch.ping_due(now):
                self.sock.send_multipart(m.encode(m.ServerQuery(0)), zmq.NOBLOCK)
        if self.broker_watch.stuck(now):
            self.broker_watch.started()  # judged again once the next one answers
            for c in self.children:
                if c.role == "broker":
                    log.error("broker (pid %d) did not answer for %.0fs: stuck; killing it",
                              c.proc.pid, self.broker_watch.silent_s)  # fmt: skip
                    c.proc.kill()  # (not reaped yet: its pid is still its own)

    def _from_broker(self) -> None:
        """The broker's answers (any says it lives), its welcome, and the workers it asks
        for (models loaded through the model control API)."""
        assert self.sock is not None
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.broker_watch.heard(time.monotonic())
            try:
                msg = m.decode(frames[0], frames[1])
            except (ValueError, IndexError) as exc:
                log.warning("dropped a malformed message from the broker: %s", exc)
                continue
            if isinstance(msg, m.Welcome):
                self.welcomed = True
            elif isinstance(msg, m.StartWorkers | m.GenerationsGone) and not self.welcomed:
                # a lost broker's last words, read after its death (no other broker asks
                # before its welcome): its loads are over (_broker_lost), and the next
                # broker numbers its own afresh
                log.info("ignored the lost broker's %s", type(msg).__name__)
            elif isinstance(msg, m.StartWorkers) and not self.stop:
                for spec in msg.workers:
                    name, argv = self.worker_argv(spec)
                    self._spawn(f"worker {name}", argv)
            elif isinstance(msg, m.GenerationsGone):
                self._generations_gone(set(msg.generations))

    def _generations_gone(self, gone: set[int]) -> None:
        """Workers of loads the broker has no version of: those still running (never
        said hello, or on their way out) are stopped, and none is restarted."""
        self.gone_generations |= gone
        self.restarts = [r for r in self.restarts if _generation(r[2]) not in gone]
        for c in self.children:
            if c.generation in gone:
                with contextlib.suppress(ProcessLookupError):
                    c.proc.send_signal(signal.SIGTERM)

    def _reap(self, child: Child) -> int | None:
        """Handle a child's exit; returns the launcher's exit code when it must stop."""
        rc = child.proc.wait()
        self.children.remove(child)
        os.close(child.pidfd)
        shm.sweep_stale({child.proc.pid})
        outlived_broker = child.proc.pid in self.outlived_broker
        self.outlived_broker.discard(child.proc.pid)
        if self.stop:
            return None
        if child.proc.pid in self.ended_loads:
            self.ended_loads.discard(child.proc.pid)
            log.info("%s stopped: its load ended with the broker", child.role)
            return None
        # (first: a worker the broker retired says so by its exit code, whether or not the
        # news that its load is over reached this process before its exit did)
        if rc == EXIT_RETIRED and child.role.startswith("worker") and self.managed:
            if not outlived_broker:
                log.info("%s stopped: its model was unloaded or reloaded", child.role)
                return None
            # Retired, maybe by the broker that was lost: the next one serves the start-up
            # models (this instance among them) and waits for it. (Retired by the next
            # one, it is told again when it greets it, and stops before it loads.)
            again = restart_policy.WORKER.backoff_s[0]
            log.warning("%s stopped: retired while a broker was lost; starting it again for "
                        "the new broker in %.1fs", child.role, again)  # fmt: skip
            self.restarts.append((time.monotonic() + again, child.role, child.argv, 0))
            return None
        if child.generation in self.gone_generations:
            log.info("%s stopped: its load is over", child.role)
            return None
        if rc == EXIT_FATAL:
            if child.role == "broker":  # (it logged why: models that failed to load)
                log.error("broker cannot serve; stopping the server")
                return 1
            if child.role.startswith("frontend"):
                log.error("%s cannot run; stopping the server", child.role)
                return rc
            log.error("%s failed to load its model; not restarting it", child.role)
            return None
        policy = restart_policy.for_role(child.role)
        quick, delay = policy.after_exit(child.restarts, time.monotonic() - child.started)
        if delay is None:
            log.error(
                "%s %s, its exit %d in a row within %.0fs of its start: a crash loop; "
                "stopping the server", child.role, _exit_reason(rc), quick,
                policy.stable_after_s,
            )  # fmt: skip
            return 1
        # A clean exit is a child stopped on its own (an operator's SIGTERM to it alone):
        # worth a warning, not an error.
        level = logging.WARNING if rc == 0 else logging.ERROR
        log.log(level, "%s %s; restarting in %.1fs", child.role, _exit_reason(rc), delay)
        self.restarts.append((time.monotonic() + delay, child.role, child.argv, quick))
        if child.role == "broker":
            self._broker_lost()
        return None

    def _broker_lost(self) -> None:
        """The broker died; the frontends and workers wait for the next one. What the
        model control API loaded was the lost broker's: those workers are killed (their
        requests failed with the broker; a SIGTERM would let one finish its batch and
        greet the next broker, whose own loads are numbered afresh: it could pass for one
        of them), none is restarted, and the next broker serves the start-up models, as
        at start: a start-up worker the lost broker was retiring (an unload, a reload)
        and that stops only now is started again (_reap)."""
        self.welcomed = False  # the next broker hears this launcher's hello
        self.gone_generations.clear()
        self.restarts = [r for r in self.restarts if _generation(r[2]) == 0]
        for c in self.children:
            if c.generation:
                self.ended_loads.add(c.proc.pid)
                c.proc.kill()  # (not reaped yet: its pid is still its own)
            elif c.role.startswith("worker"):
                self.outlived_broker.add(c.proc.pid)

    def _start_missing_workers(self) -> None:
        """A new broker waits for every start-up instance: those not running (their load
        failed, they were unloaded under the last broker) start again, as at start, so
        it gets to know each one's outcome."""
        running = {c.role for c in self.children if c.generation == 0}
        running |= {role for _, role, _, _ in self.restarts}
        try:
            planned = self.worker_argvs()
        except Exception:  # an unreadable repository: the broker says why
            log.exception("cannot plan the workers again for the new broker")
            return
        for name, argv in planned:
            if f"worker {name}" not in running:
                log.info("worker %s: started again for the new broker", name)
                self._spawn(f"worker {name}", argv)

    def _signal(self, roles: tuple[str, ...], sig: int) -> list[Child]:
        chosen = [c for c in self.children if c.role.startswith(roles)]
        for c in chosen:
            with contextlib.suppress(ProcessLookupError):
                c.proc.send_signal(sig)
        return chosen

    def _wait(self, children: list[Child], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for c in children:
            try:
                c.proc.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) did not stop in time; killing it", c.role, c.proc.pid)
                c.proc.kill()
                c.proc.wait()

    def close(self) -> None:
        """Stop every child in order and sweep what they left (always runs after run)."""
        self.stop = True
        self._wait(self._signal(("frontend",), signal.SIGTERM), self.s.exit_timeout_secs + 5)
        self._wait(self._signal(("broker", "worker"), signal.SIGTERM), 10)
        pids = {c.proc.pid for c in self.children}
        for c in self.children:
            os.close(c.pidfd)
        self.children.clear()
        shm.sweep_stale(pids)
        shm.sweep_stale()
        if self.sock is not None and self.ctx is not None:
            self.sock.close(0)
            self.ctx.term()
        if self.own_runtime_dir:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
        if self.s.repository_locations:  # the models' cache
            shutil.rmtree(self.s.model_repository, ignore_errors=True)
        log.info("stopped")


def _generation(argv: list[str]) -> int:
    """The load a worker's argv belongs to (``--generation``); 0: none given."""
    if "--generation" in argv:
        return int(argv[argv.index("--generation") + 1])
    return 0


def _exit_reason(rc: int) -> str:
    """How a child ended, from Popen's return code (negative: the signal that killed it)."""
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with code {rc}"
