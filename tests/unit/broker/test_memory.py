"""shoal.broker.memory reads what a process holds of its own, and only that, and picks the
instances over their limit."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from shoal.broker.memory import MIB, over_limit, private_memory, rss_anon, supported
from shoal.broker.models import Instance


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


def test_rss_anon_is_read_from_a_status_text_and_missing_where_a_kernel_omits_it() -> None:
    linux = b"Name:\tpython\nVmRSS:\t  90000 kB\nRssAnon:\t   41732 kB\nRssFile:\t 47644 kB\n"
    assert rss_anon(linux) == 41732 * 1024
    gvisor = b"Name:\tpython\nVmSize:\t 200000 kB\nVmRSS:\t  90000 kB\nVmData:\t 5000 kB\n"
    assert rss_anon(gvisor) is None
    assert supported()  # this kernel says


def _instance(index: int, state: str = "READY", model: str = "m") -> Instance:
    inst = Instance(f"w{index}".encode(), model, 1, index, 100 + index)
    inst.state = state  # type: ignore[assignment]
    return inst


def test_over_limit_reads_only_ready_instances_that_have_a_limit() -> None:
    insts = [
        _instance(0),  # over
        _instance(1),  # under
        _instance(2, "LOADING"),  # a load may peak: not read
        _instance(3, "DEAD"),  # killed already: not read
        _instance(4, model="free"),  # no limit: not read
        _instance(5),  # gone between the listing and the read
    ]
    used = {100: 300 * MIB, 101: 100 * MIB, 102: 900 * MIB, 103: 900 * MIB, 104: 900 * MIB}
    reads: list[int] = []

    def read(pid: int) -> int | None:
        reads.append(pid)
        return used.get(pid)

    over = over_limit(insts, lambda i: 0 if i.model == "free" else 200, read)
    assert [(o.inst.index, o.used, o.limit_mb) for o in over] == [(0, 300 * MIB, 200)]
    assert reads == [100, 101, 105]


def test_an_instance_being_stopped_is_read_again_and_twice_its_limit_is_a_runaway() -> None:
    stopping = _instance(0, "DEAD")  # retired: asked to stop after its batch
    killed = _instance(1, "DEAD")  # ended otherwise: never read again
    used = {100: 300 * MIB, 101: 900 * MIB}
    over = over_limit([stopping, killed], lambda i: 200, used.get, stopping={b"w0"})
    assert [(o.inst.index, o.runaway) for o in over] == [(0, False)]
    assert over[0].reason == "it held 300 MiB of memory, over its limit of 200 MiB"
    used[100] = 401 * MIB
    (o,) = over_limit([stopping], lambda i: 200, used.get, stopping={b"w0"})
    assert o.runaway
