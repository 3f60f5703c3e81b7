"""Where the CPUs go during a benchmark point, and a load that takes the same share.

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

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from types import TracebackType

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


def worker_pids(root: int) -> list[int]:
    """The model-instance workers (``python -m workers``) under shoal's launcher ``root``."""
    out = []
    for pid in _children(root):
        argv = _cmdline(pid)
        if "-m" in argv and argv[argv.index("-m") + 1 :][:1] == ["workers"]:
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
