"""shoal.ipc.lifecycle: set_cpu_scheduling, settle_gc and the open-file limit, in a fresh
interpreter each (they change the process)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_PROBE = """
import os, threading
from shoal.ipc.lifecycle import set_cpu_scheduling
print(set_cpu_scheduling())
seen = []
t = threading.Thread(target=lambda: seen.append(os.sched_getscheduler(0)))
t.start(); t.join()
print(os.sched_getscheduler(0), seen[0])
"""


def _probe(value: str | None, started_under: int = os.SCHED_OTHER) -> tuple[list[str], str]:
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_CPU_SCHED"}
    if value is not None:
        env["SHOAL_CPU_SCHED"] = value
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=lambda: os.sched_setscheduler(0, started_under, os.sched_param(0)),
    )
    return out.stdout.split(), out.stderr


@pytest.mark.parametrize("value", [None, "batch", " BATCH ", ""])
def test_batch_by_default_and_inherited_by_threads(value: str | None) -> None:
    words, stderr = _probe(value)
    assert words == ["batch", str(os.SCHED_BATCH), str(os.SCHED_BATCH)]
    assert stderr == ""


def test_inherit_keeps_the_policy_shoal_was_started_under() -> None:
    assert _probe("inherit")[0] == ["other", str(os.SCHED_OTHER), str(os.SCHED_OTHER)]
    assert _probe("inherit", os.SCHED_BATCH)[0] == ["batch", *[str(os.SCHED_BATCH)] * 2]


def test_a_policy_the_operator_chose_is_kept() -> None:
    """`chrt --idle shoal serve` stays idle (real-time would need a privilege here)."""
    assert _probe(None, os.SCHED_IDLE)[0] == ["idle", str(os.SCHED_IDLE), str(os.SCHED_IDLE)]


def test_an_unknown_value_is_named_and_batch_is_used() -> None:
    words, stderr = _probe("fifo")
    assert words == ["batch", str(os.SCHED_BATCH), str(os.SCHED_BATCH)]
    assert "SHOAL_CPU_SCHED='fifo' is not one of batch/inherit; using batch" in stderr


_GC_PROBE = """
import gc
from shoal.ipc.lifecycle import settle_gc
class Node:
    pass
kept = [Node() for _ in range(1000)]
settle_gc()
frozen = gc.get_freeze_count()
a, b = Node(), Node()
a.other, b.other = b, a  # a cycle made after start-up is still collected
del a, b
print(frozen >= 1000, gc.collect() >= 2, gc.get_freeze_count() == frozen)
"""


def test_settle_gc_freezes_what_exists_and_still_collects_later_cycles() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _GC_PROBE], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["True", "True", "True"]


_NOFILE_PROBE = """
import logging, resource
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
from shoal.ipc.lifecycle import raise_open_file_limit
print(raise_open_file_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))
"""


@pytest.mark.parametrize(
    ("soft", "hard", "line"),
    [
        (256, 2048, "INFO open files: soft limit raised from 256 to 2048 (the hard limit)"),
        (1024, 1024, "INFO open files: soft limit 1024 (hard limit 1024)"),
    ],
)
def test_the_open_file_limit_is_raised_to_the_hard_limit_and_logged(
    soft: int, hard: int, line: str
) -> None:
    import resource

    out = subprocess.run(
        [sys.executable, "-c", _NOFILE_PROBE],
        capture_output=True,
        text=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),
    )
    assert out.returncode == 0, out.stderr  # (what a crash of the probe said)
    assert out.stdout.split() == [str(hard)] * 3
    assert out.stderr.splitlines() == [line]
