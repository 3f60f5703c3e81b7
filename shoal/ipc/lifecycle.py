"""Process plumbing every role shares: its flags and dying with the parent.

PDEATHSIG makes a child of ``shoal serve`` die when the launcher dies, so a SIGKILLed
launcher never leaves orphans. It is armed in the child itself, and the child checks
it was not already reparented before the flag took effect.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import gc
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Protocol

_PR_SET_PDEATHSIG = 1
EXIT_FATAL = 3  # a role cannot run with its settings: restarting it cannot help
EXIT_RETIRED = 4  # a worker whose model was unloaded or reloaded: not to be restarted


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists; one of another user (a pid taken over) counts as
    alive: whatever it holds is left alone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def die_with_parent(expected_parent: int | None, sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` when the parent exits (Linux only)."""
    if expected_parent is None or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except OSError:
        return
    if os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)


#: How role processes are scheduled: "batch" (the default) or "inherit".
CPU_SCHED_ENV = "SHOAL_CPU_SCHED"
_CHOICES = ("batch", "inherit")


def set_cpu_scheduling() -> str:
    """Move this process from SCHED_OTHER to SCHED_BATCH, unless
    ``SHOAL_CPU_SCHED=inherit``; returns the name of the policy it runs under. Any other
    policy it was started under (``chrt``: real-time, idle, batch) is the operator's
    choice and is kept. Call before any thread starts: threads inherit it.

    A request crosses three processes, and each hop passes two ZeroMQ I/O threads (the
    sender's and the receiver's). Under SCHED_OTHER every hand-off can preempt the
    thread that made it: the sender's I/O thread wakes and takes the core before the
    sender reaches its next poll, and so on down the chain, a context switch more per
    hop. SCHED_BATCH keeps the fair share and the nice value but gives up wake-up
    preemption, so a hand-off waits for a free core or the end of the running thread's
    turn. Measured with perf_analyzer on 2 cores: 10-20% more requests per second at
    concurrency 1 on a small model and a lower p99, no change at concurrency 8 or on a
    compute-bound model. No privilege is needed; clients and other programs on the host
    keep their own policy and still preempt shoal's.
    """
    log = logging.getLogger("shoal")
    wanted = os.environ.get(CPU_SCHED_ENV, "batch").strip().lower() or "batch"
    if wanted not in _CHOICES:
        log.warning(
            "%s=%r is not one of %s; using batch", CPU_SCHED_ENV, wanted, "/".join(_CHOICES)
        )
        wanted = "batch"
    if not hasattr(os, "sched_setscheduler"):
        return "other"  # not Linux
    current = os.sched_getscheduler(0)
    if wanted == "batch" and current == os.SCHED_OTHER:
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
            current = os.SCHED_BATCH
        except OSError as exc:  # a seccomp profile may forbid it: run as we are
            log.warning("could not set SCHED_BATCH: %s", exc)
    return _policy_name(current)


def settle_gc() -> None:
    """Call once a role has started (imports made, model loaded): what exists by then
    lives as long as the process, so it leaves the cyclic collector's view. Otherwise
    every full collection walks all the objects the imports made (aiohttp, grpcio,
    numpy, the backends' bindings): 5-10% of a busy frontend's CPU in perf profiles.
    Objects made later are collected as before."""
    gc.collect()
    gc.freeze()


def exit_by(deadline_s: float, role: str) -> None:
    """Guarantee that this process ends within ``deadline_s`` from now, whatever its
    shutdown waits on: past it, every thread's stack goes to stderr (the role's log,
    to show what hung) and the process exits with status 1. Call it once the stop has
    begun; a daemon thread keeps the time."""

    def overdue() -> None:
        time.sleep(deadline_s)
        sys.stderr.write(f"{role}: shutdown still running after {deadline_s:.0f}s; exiting\n")
        faulthandler.dump_traceback(all_threads=True)
        sys.stderr.flush()
        os._exit(1)

    threading.Thread(target=overdue, name="shoal-exit-by", daemon=True).start()


def raise_open_file_limit() -> int:
    """Raise this process's open-file soft limit to its hard limit, log (INFO) the limit
    it runs with, and return it. Every role calls it at start: systemd's default soft limit
    (1024) would refuse the broker a few hundred client shared-memory registrations (one
    descriptor each), a worker as many mapped regions, and a frontend its connections."""
    import resource

    log = logging.getLogger("shoal")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    was = soft
    # An unlimited hard limit still stops at the kernel's per-process ceiling.
    target = hard if hard != resource.RLIM_INFINITY else _kernel_open_file_ceiling()
    if soft != target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d: %s", was, exc)
    if soft != was:
        log.info("open files: soft limit raised from %d to %d (the hard limit)", was, soft)
    else:
        log.info("open files: soft limit %d (hard limit %s)", soft, _shown(hard))
    return soft if soft != resource.RLIM_INFINITY else 2**20


def _kernel_open_file_ceiling() -> int:
    try:
        return int(Path("/proc/sys/fs/nr_open").read_text())
    except (OSError, ValueError):
        return 2**20


def _shown(limit: int) -> str:
    import resource

    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)


def _policy_name(policy: int) -> str:
    for name in ("OTHER", "BATCH", "IDLE", "FIFO", "RR", "DEADLINE"):
        if policy == getattr(os, f"SCHED_{name}", None):
            return name.lower()
    return str(policy)


class Stoppable(Protocol):
    stop: bool

    def run(self) -> int: ...

    def close(self) -> None: ...


def run_until_stopped(proc: Stoppable) -> int:
    """SIGTERM/SIGINT only set ``proc.stop``; the loop notices, then ``close`` releases."""

    def _stop(signum: int, frame: object) -> None:
        proc.stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        return proc.run()
    finally:
        proc.close()


def add_process_flags(parser: argparse.ArgumentParser) -> None:
    """Flags every role process takes (and configs.flags.common.add_log_flags)."""
    parser.add_argument("--runtime-dir", required=True, type=Path)
    parser.add_argument("--parent-pid", default=None, type=int, help=argparse.SUPPRESS)
