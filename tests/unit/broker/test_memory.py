"""broker.memory reads what a process holds of its own, and only that."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from broker.memory import MIB, private_memory


def test_memory_a_process_writes_counts() -> None:
    before = private_memory(os.getpid())
    assert before is not None and before > 0
    held = np.ones(64 * MIB, dtype=np.uint8)  # written: resident
    after = private_memory(os.getpid())
    assert after is not None and after - before >= 60 * MIB
    del held


def test_shared_memory_and_file_pages_do_not_count(tmp_path: Path) -> None:
    """A frontend's slab or a client's region, mapped and read by a worker, is not its
    own memory; nor is a model file it maps."""
    shm_path = (
        Path("/dev/shm") / f"test-broker-memory-{os.getpid()}"
    )  # not shoal-: no sweep takes it
    file_path = tmp_path / "weights.bin"
    try:
        for path in (shm_path, file_path):
            path.write_bytes(b"\x01" * (32 * MIB))
        before = private_memory(os.getpid())
        assert before is not None
        maps = []
        for path in (shm_path, file_path):
            with open(path, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            pages = np.frombuffer(mm, dtype=np.uint8)[::4096]  # one read per page
            assert int(pages.sum(dtype=np.int64)) == 32 * MIB // 4096
            del pages
            maps.append(mm)
        after = private_memory(os.getpid())
        assert after is not None and after - before < 8 * MIB
        for mm in maps:
            mm.close()
    finally:
        shm_path.unlink(missing_ok=True)


def test_a_process_gone_has_none() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert private_memory(child.pid) is None
