"""Where the CPUs go during a benchmark point, and a load that takes the same share.

``PerRequest`` reads every process of a server from ``/proc/<pid>/stat`` around one load
run and divides their CPU time (user + system) by the requests the server says it served
(its ``/v2/models/<m>/stats``): µs of CPU per request, per shoal role (frontend, broker,
worker, launcher) or for another server as a whole, and the client's (perf_analyzer's)
beside it. It moves far less than throughput between runs: the figure to steer by.

On a 2-core machine the client (perf_analyzer), shoal's frontend and its broker run on the
same cores as the model. ``Snapshot`` reads the kernel's tick counters before and after a
point: the machine's busy time, and the time of the server's model workers. What is not the
model's (``side_cores``) is what the model had to share the cores with.

``CpuLoad`` puts that share back while the in-process ONNX Runtime baseline runs: processes
that spin for a fraction of every millisecond and sleep for the rest, so the baseline
competes for the cores as the model did in the server. An emulation (the real client and
frontend wake in bursts tied to the batches), so the report shows it beside the idle
baseline, never instead of it.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perf_analyzer import Measurement

_TICK = os.sysconf("SC_CLK_TCK")

#: Spins ``duty`` of every millisecond until killed. No imports beyond ``time``: it must
#: not add a cold start of its own to the cores it shares.
_BURNER = """
import sys, time
duty = float(sys.argv[1]) * 1e-3
clock, sleep = time.perf_counter, time.sleep
while True:
    t = clock()
    while clock() - t < duty:
        pass
    sleep(1e-3 - duty)
"""


def _machine_busy_ticks() -> int:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle  # guest time is already inside user


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(k) for k in f.read().split()]
    except OSError:
        return []
    return kids + [g for k in kids for g in _children(k)]


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:
        return []


def _ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(rest[11]) + int(rest[12])  # utime + stime


def _zmq_io_ticks(pid: int) -> int:
    """CPU ticks of a process's ZeroMQ I/O threads (named ``ZMQbg/IO/<n>`` by libzmq)."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
        except OSError:
            continue
        if head.split("(", 1)[1].startswith("ZMQbg/IO"):
            fields = rest.split()
            total += int(fields[11]) + int(fields[12])
    return total


def worker_pids(root: int) -> list[int]:
    """The model-instance workers (``python -m shoal.workers``) under shoal's launcher ``root``."""
    out = []
    for pid in _children(root):
        argv = _cmdline(pid)
        if "-m" in argv and argv[argv.index("-m") + 1 :][:1] == ["shoal.workers"]:
            out.append(pid)
    return out


@dataclass(frozen=True)
class Snapshot:
    at: float
    busy: int
    model: dict[int, int]  # worker pid -> ticks

    @classmethod
    def take(cls, model_pids: list[int]) -> Snapshot:
        model = {p: t for p in model_pids if (t := _ticks(p)) is not None}
        return cls(time.monotonic(), _machine_busy_ticks(), model)


@dataclass(frozen=True)
class Usage:
    """Cores in use between two snapshots, averaged over the time between them."""

    model_cores: float
    side_cores: float  # everything else on the machine: client, frontend, broker, noise


def usage(before: Snapshot, after: Snapshot) -> Usage:
    dt = after.at - before.at
    if dt <= 0:
        return Usage(0.0, 0.0)
    model = sum(t - before.model[p] for p, t in after.model.items() if p in before.model)
    busy = after.busy - before.busy
    return Usage(model / _TICK / dt, max(busy - model, 0) / _TICK / dt)


class CpuLoad:
    """``cores`` of busy time spread over ``ceil(cores)`` spinning processes, each under
    one core, for the duration of a ``with`` block. ``cores`` 0 starts nothing."""

    def __init__(self, cores: float) -> None:
        self.cores = max(cores, 0.0)
        self._procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> CpuLoad:
        n = int(-(-self.cores // 1))  # ceil
        for _ in range(n):
            duty = min(self.cores / n, 0.95)
            self._procs.append(
                subprocess.Popen([sys.executable, "-S", "-c", _BURNER, f"{duty:.3f}"])
            )
        time.sleep(0.2 if n else 0)  # past the interpreters' start
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for p in self._procs:
            p.kill()
        for p in self._procs:
            p.wait()
        self._procs.clear()


#: shoal's processes by the module they run (``python -m <module>``), as roles.
_ROLES = {"shoal.frontend": "frontend", "shoal.broker": "broker", "shoal.workers": "worker"}
#: The order a report lists the roles in; "server" sums them (the client is not the server's);
#: "zmq io" is the part of the server's that its processes' ZeroMQ I/O threads spent.
ROLE_ORDER = ("frontend", "broker", "worker", "launcher", "server", "zmq io", "client")


def role_of(argv: list[str]) -> str:
    """shoal's role for a process's command line: "frontend", "broker", "worker", or
    "launcher" for anything else of the server's (``shoal serve`` itself)."""
    if "-m" in argv:
        module = argv[argv.index("-m") + 1 :][:1]
        if module and module[0] in _ROLES:
            return _ROLES[module[0]]
    return "launcher"


def _tree(root: int) -> list[int]:
    from servers import descendants  # (servers imports nothing of this module)

    return [root, *descendants(root)]


def cpu_ns_by_role(root: int) -> dict[str, int]:
    """On-CPU ns so far of a shoal server's processes (``root`` and below) by role, from
    each thread's ``/proc/<pid>/task/<tid>/schedstat``: nanoseconds, where
    ``/proc/<pid>/stat`` counts 10 ms ticks, so a one-second slice of a run is measured
    to well under 1%. A thread that ended since an earlier reading takes its time with it
    (shoal's threads live as long as their process)."""
    out: dict[str, int] = {}
    for pid in _tree(root):
        role = role_of(_cmdline(pid))
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    out[role] = out.get(role, 0) + int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return out


def served(http: str, model: str) -> int:
    """Requests the server at ``http`` says it answered with success, all versions of
    ``model`` (Triton's statistics extension: shoal and Triton alike)."""
    with urllib.request.urlopen(f"http://{http}/v2/models/{model}/stats", timeout=10) as r:
        doc = json.loads(r.read())
    return sum(
        int(s.get("inference_stats", {}).get("success", {}).get("count", 0))
        for s in doc.get("model_stats", [])
    )


def _client_ticks() -> float:
    """CPU seconds of this process's waited-for children (perf_analyzer)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


class PerRequest:
    """CPU µs per request of a server's processes over a ``with`` block, by role.

    ``root``: the server's process (its children are found below it, and shoal's by
    ``--parent-pid`` too); ``by_role``: shoal's roles apart (else the whole tree is
    "server"). ``result`` maps each role to µs per request, with "server" their sum and
    "client" the CPU of the children this process waited for meanwhile (perf_analyzer);
    None when the server answered nothing in the block. Processes that start or end
    during the block count for the part of it they were seen in at both ends."""

    def __init__(self, root: int, http: str, model: str, by_role: bool) -> None:
        self.root, self.http, self.model, self.by_role = root, http, model, by_role
        self.result: dict[str, float] | None = None

    def _ticks(self) -> dict[int, tuple[str, int, int]]:
        """Each process's role, CPU ticks, and its ZeroMQ I/O threads' ticks (shoal's)."""
        out = {}
        for pid in _tree(self.root):
            t = _ticks(pid)
            if t is not None:
                role = role_of(_cmdline(pid)) if self.by_role else "server"
                out[pid] = (role, t, _zmq_io_ticks(pid) if self.by_role else 0)
        return out

    def __enter__(self) -> PerRequest:
        self._before = self._ticks()
        self._client = _client_ticks()
        self._served = served(self.http, self.model)
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            return
        after = self._ticks()
        n = served(self.http, self.model) - self._served
        if n <= 0:
            return
        per: dict[str, float] = {}
        zmq_io = 0
        for pid, (role, t, z) in after.items():
            if pid in self._before:
                per[role] = per.get(role, 0.0) + (t - self._before[pid][1]) / _TICK * 1e6 / n
                zmq_io += z - self._before[pid][2]
        per["server"] = sum(per.values())
        if self.by_role:
            per["zmq io"] = zmq_io / _TICK * 1e6 / n
        per["client"] = (_client_ticks() - self._client) * 1e6 / n
        self.result = per


def measured(
    root: int | None, http: str, model: str, by_role: bool, run: Callable[[], Measurement]
) -> Measurement:
    """``run()``'s measurement with the server's CPU per request (``cpu_us``) added, when
    the server's process ``root`` is known (a server this run started)."""
    if root is None:
        return run()
    with PerRequest(root, http, model, by_role) as cpu:
        m = run()
    return replace(m, cpu_us=cpu.result)


def cpu_table(results: list[Measurement]) -> list[str]:
    """A markdown table of the measurements that carry ``cpu_us`` (none: no lines)."""
    rows = [m for m in results if m.cpu_us]
    if not rows:
        return []
    lines = [
        "",
        "## CPU per request (µs of user + system time, /proc/<pid>/stat, over each run)",
        "",
        "`server` sums the server's processes (for Triton: tritonserver and its Python "
        "stubs); `client` is perf_analyzer's own. Divided by the requests the server's "
        "statistics counted as successes during the run. `zmq io`: the part of shoal's "
        "`server` that its processes' ZeroMQ I/O threads spent (libzmq's background "
        "threads, which carry every message between the processes).",
        "",
        "| model | c | server | protocol | frontends | " + " | ".join(ROLE_ORDER) + " |",
        "|---|---:|---|---|---:|" + "---:|" * len(ROLE_ORDER),
    ]
    for m in rows:
        assert m.cpu_us is not None
        cells = " | ".join(f"{m.cpu_us[r]:,.0f}" if r in m.cpu_us else "—" for r in ROLE_ORDER)
        fe = "—" if m.frontends is None else str(m.frontends)
        lines.append(
            f"| {m.model} | {m.concurrency} | {m.server} | {m.protocol} | {fe} | {cells} |"
        )
    return lines
