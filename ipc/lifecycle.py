"""Process plumbing every role shares: logging setup and dying with the parent.

PDEATHSIG makes a child of ``shoal serve`` die when the launcher dies, so a SIGKILLed
launcher never leaves orphans. It is armed in the child itself, and the child checks
it was not already reparented before the flag took effect.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Protocol

_PR_SET_PDEATHSIG = 1
EXIT_FATAL = 3  # a role cannot run with its settings: restarting it cannot help


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


def setup_logging(role: str, verbose: int) -> None:
    level = logging.DEBUG if verbose > 0 else logging.INFO
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s.%(msecs)03d {role}[%(process)d] %(levelname).1s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )


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
    """Flags every role process takes."""
    parser.add_argument("--runtime-dir", required=True, type=Path)
    parser.add_argument("--log-verbose", default=0, type=int)
    parser.add_argument("--parent-pid", default=None, type=int, help=argparse.SUPPRESS)
