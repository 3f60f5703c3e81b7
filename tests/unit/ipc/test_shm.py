"""Slab allocation, mapping by name, and the stale-segment sweep."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from shoal.ipc import shm


@pytest.fixture
def pool():
    p = shm.SlabPool("test", 4 << 20)
    yield p
    p.close()
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"shoal-{os.getpid()}-test-")]


def test_slots_do_not_overlap_and_are_reused(pool: shm.SlabPool) -> None:
    a = pool.alloc(1000)
    b = pool.alloc(5000)
    assert a.region == b.region
    assert a.offset + a.capacity <= b.offset
    assert a.offset % shm.ALIGN == 0 and b.offset % shm.ALIGN == 0
    pool.free(a)
    c = pool.alloc(900)
    assert c.offset == a.offset  # first fit takes the freed span again
    pool.free(b)
    pool.free(c)
    big = pool.alloc(4 << 20)  # the whole slab again: spans coalesced
    assert big.offset == 0
    pool.free(big)


def test_pool_grows_for_large_requests_and_shrinks_back(pool: shm.SlabPool) -> None:
    base = pool.total_bytes
    slots = [pool.alloc(3 << 20) for _ in range(3)]
    assert pool.total_bytes > base
    assert pool.used_bytes == 3 * (3 << 20)
    for s in slots:
        pool.free(s)
    assert pool.used_bytes == 0
    pool.free(pool.alloc(1))
    assert len(pool.names()) <= 1 + 4  # growth slabs beyond the keep limit are unlinked


def test_region_map_reads_what_the_owner_wrote(pool: shm.SlabPool) -> None:
    slot = pool.alloc(16)
    slot.view[:] = b"0123456789abcdef"
    regions = shm.RegionMap()
    try:
        assert bytes(regions.view(slot.region, slot.offset + 4, 4)) == b"4567"
        regions.view(slot.region, slot.offset, 4)[:] = b"WXYZ"
        assert bytes(slot.view[:4]) == b"WXYZ"
        with pytest.raises(ValueError):
            regions.view(slot.region, 4 << 20, 1)
        with pytest.raises(ValueError):
            regions.view("not-ours", 0, 1)
        with pytest.raises(ValueError):
            regions.view("../etc/passwd", 0, 1)
    finally:
        regions.close()
        pool.free(slot)


def test_sweep_removes_only_dead_owners(pool: shm.SlabPool) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = f"shoal-{dead.pid}-front-0123456789abcdef"
    with open(f"/dev/shm/{stale}", "wb") as f:
        f.write(b"x")
    removed = shm.sweep_stale()
    assert stale in removed
    assert all(os.path.exists(f"/dev/shm/{n}") for n in pool.names())


def test_a_segment_is_visible_only_once_its_owner_holds_its_lock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sweep that runs while a segment is being created must not take it for stale:
    it is created as <name>.new, which sweepers remove only once it is old (its pid
    cannot tell across pid namespaces), and renamed once locked. Two processes racing
    (create, sweep) lost 44 of 20,000 live segments before."""
    import fcntl

    fresh = f"shoal-{os.getpid()}-front-00000000000000aa.new"  # mid-creation, not locked
    old = "shoal-999999999-front-00000000000000bb.new"  # its creator died there long ago
    for name in (fresh, old):
        (shm.SHM_DIR / name).write_bytes(b"")
    an_hour_ago = time.time() - 3600
    os.utime(shm.SHM_DIR / old, (an_hour_ago, an_hour_ago))
    try:
        removed = shm.sweep_stale()
        assert old in removed and fresh not in removed
        assert (shm.SHM_DIR / fresh).exists()
    finally:
        (shm.SHM_DIR / fresh).unlink()
    seg = shm.ShmSegment(4096, "front")
    try:
        assert not (shm.SHM_DIR / (seg.name + ".new")).exists()
        fd = os.open(shm.SHM_DIR / seg.name, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):  # the owner's lock: a sweeper keeps off
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        assert seg.name not in shm.sweep_stale()
    finally:
        seg.close()
    # A .new another sweeper removed anyway: the creation fails cleanly, nothing held.
    before = len(os.listdir("/proc/self/fd"))

    def vanished(src: object, dst: object) -> None:
        os.unlink(str(src))
        raise FileNotFoundError(str(src))

    monkeypatch.setattr(shm.os, "rename", vanished)
    with pytest.raises(FileNotFoundError):
        shm.ShmSegment(4096, "front")
    assert len(os.listdir("/proc/self/fd")) == before


def test_worker_mappings_of_unlinked_or_dead_owner_slabs_are_dropped() -> None:
    pool = shm.SlabPool("test", 2 << 20)
    other = shm.SlabPool("test", 2 << 20)
    regions = shm.RegionMap()
    try:
        a, b = pool.alloc(8), other.alloc(8)
        regions.view(a.region, a.offset, 8)
        regions.view(b.region, b.offset, 8)
        pool.free(a)
        pool.close()  # unlinks its slab
        regions.drop_unlinked()
        assert list(regions._maps) == [b.region]
        regions.forget_owner(os.getpid())
        assert not regions._maps
        other.free(b)
    finally:
        regions.close()
        other.close()


def test_full_dev_shm_is_an_error_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(shm.ShmFull, match="raise --shm-size"):
        shm.SlabPool("test", 2 << 20)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"shoal-{os.getpid()}-test-")]
