"""Where each shoal role's CPU goes, per request: cProfile on each process's own CPU clock.

Starts ``shoal serve`` on a temporary repository of one model (``dynamic_batching {}``
added), keeps perf_analyzer at one concurrency and protocol, and profiles the frontend,
the broker and the worker for ``--seconds`` of that steady load: each process runs under
``cProfile`` with ``time.thread_time`` as its clock (the CPU of its main thread, not wall
time, so a process preempted by the one it just woke is not charged for it), switched on
and off by signals once the load is steady. Each role's report lists its Python calls per
request and the functions that took the most CPU, per request served.

What it is for: finding per-request work that should not be there (it found grpc.aio
waiting on one future per registered method, 25 of them, for every call). Profiled times
are inflated by the profiler (each call costs a clock read): compare them with each other
and between two trees (``--tree``), not with the CPU-per-request tables of run.py. Native
code (ONNX Runtime, libzmq, the kernel) shows as the Python call that entered it.

    python bench/profile_roles.py [--protocol http|grpc] [--concurrency 8] [--model mlp]
                                  [--seconds 8] [--top 25] [--tree OTHER_CHECKOUT]
"""

from __future__ import annotations

import argparse
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cpu
from common import measured_repo
from perf_analyzer import PROTOCOL_FLAGS, perf_analyzer_path
from servers import REPO_ROOT, descendants, shoal_server

#: Put on PYTHONPATH of the server: in shoal's role processes, SIGUSR1 starts a profile
#: on the thread CPU clock and SIGUSR2 writes it to $SHOAL_PROFILE_DIR/<role>-<pid>.prof.
_HOOK = """
import os
if os.environ.get("SHOAL_PROFILE_DIR"):
    _argv = open("/proc/self/cmdline", "rb").read().split(b"\\0")
    _role = next((_argv[i + 1].decode() for i, a in enumerate(_argv[:-1]) if a == b"-m"), "")
    if _role in ("shoal.frontend", "shoal.broker", "shoal.workers"):
        import cProfile, signal, time
        _profile = cProfile.Profile(time.thread_time)

        def _start(signum, frame):
            _profile.enable()

        def _stop(signum, frame):
            _profile.disable()
            _profile.dump_stats(
                f"{os.environ['SHOAL_PROFILE_DIR']}/{_role.split('.')[1]}-{os.getpid()}.prof"
            )

        signal.signal(signal.SIGUSR1, _start)
        signal.signal(signal.SIGUSR2, _stop)
"""


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, default=REPO_ROOT / "model_repository")
    p.add_argument("--model", default="mlp")
    p.add_argument("--protocol", default="http", choices=sorted(PROTOCOL_FLAGS))
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seconds", type=float, default=8.0, help="how long each role is profiled")
    p.add_argument("--top", type=int, default=25, help="functions listed per role")
    p.add_argument("--tree", type=Path, help="profile another checkout's shoal (its package)")
    p.add_argument("--out", type=Path, help="keep the .prof files here (default: a temp dir)")
    return p.parse_args(argv)


def _profile(a: argparse.Namespace, work: Path, out: Path) -> int:
    """Run the load, profile the roles; the requests served while they were profiled."""
    (work / "hook").mkdir()
    (work / "hook" / "sitecustomize.py").write_text(_HOOK)
    repo = measured_repo(a.repo, work / "repo", [a.model], batching=True)
    srv = shoal_server(repo, out / "shoal.log")
    path = [str(work / "hook")] + ([str(a.tree.resolve())] if a.tree else [])
    srv.env = {"PYTHONPATH": os.pathsep.join(path), "SHOAL_PROFILE_DIR": str(out)}
    with srv.start(300):
        assert srv.proc is not None
        load = subprocess.Popen(
            [
                perf_analyzer_path(),
                *("-m", a.model, "-u", srv.url(a.protocol), *PROTOCOL_FLAGS[a.protocol]),
                *("-b", "1", "--concurrency-range", str(a.concurrency)),
                # one long window, never judged: perf_analyzer is the load, not the figure
                *("--measurement-interval", str(int((a.seconds + 10) * 1e3))),
                *("--max-trials", "1", "--stability-percentage", "100"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        try:
            time.sleep(3)  # past perf_analyzer's warm-up
            roles = ("frontend", "broker", "worker")
            pids = [p for p in descendants(srv.proc.pid) if cpu.role_of(cpu._cmdline(p)) in roles]
            before = cpu.served(srv.http_url, a.model)
            for pid in pids:
                os.kill(pid, signal.SIGUSR1)
            time.sleep(a.seconds)
            for pid in pids:
                os.kill(pid, signal.SIGUSR2)
            served = cpu.served(srv.http_url, a.model) - before
            time.sleep(1)  # the profiles written
        finally:
            load.kill()
            load.wait()
    return served


def _report(prof: Path, served: int, top: int) -> list[str]:
    stats = pstats.Stats(str(prof)).stats  # type: ignore[attr-defined]
    calls = sum(v[1] for v in stats.values())
    total = sum(v[2] for v in stats.values())
    lines = [
        f"## {prof.stem}: {calls / served:.0f} Python calls a request, "
        f"{total / served * 1e6:.0f} profiled µs of CPU a request",
        "",
        "| self µs/req | total µs/req | calls/req | function |",
        "|---:|---:|---:|---|",
    ]
    for (path, line, name), (_, ncalls, tt, ct, _) in sorted(
        stats.items(), key=lambda kv: -kv[1][2]
    )[:top]:
        where = path.replace(str(REPO_ROOT) + "/", "").split("site-packages/")[-1]
        lines.append(
            f"| {tt / served * 1e6:.1f} | {ct / served * 1e6:.1f} | {ncalls / served:.2f} "
            f"| `{where}:{line}({name})` |"
        )
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    a = _parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="shoal-bench-profile-") as tmp:
        out = a.out or Path(tmp) / "profiles"
        out.mkdir(parents=True, exist_ok=True)
        served = _profile(a, Path(tmp), out)
        print(
            f"# Each role's CPU by function: {a.model}, {a.protocol}, c={a.concurrency}, "
            f"{served} requests in {a.seconds:g} s ({a.tree or 'this checkout'})\n"
        )
        if served <= 0:
            print("the server answered nothing while profiled")
            return 1
        for prof in sorted(out.glob("*.prof")):
            print("\n".join(_report(prof, served, a.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
