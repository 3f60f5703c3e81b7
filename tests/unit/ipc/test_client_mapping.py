"""A worker's mapping of a client region: the client may shrink its file at any time."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.ipc import shm
from shoal.ipc.messages import ClientRegion


@pytest.fixture
def key() -> Iterator[str]:
    path = Path(f"/dev/shm/test_client_mapping_{os.getpid()}")
    path.write_bytes(bytes(range(256)) * 64)  # 16 KiB
    yield f"/{path.name}"
    path.unlink(missing_ok=True)


def _registered(
    reg_id: int, key: str, start: int, size: int, path: str = "", file_id: tuple[int, int] = (0, 0)
) -> ClientRegion:
    """A registration as the broker sends it; ``file_id`` defaults to the file the key
    names now."""
    if file_id == (0, 0):
        st = os.stat(f"/dev/shm{key}")
        file_id = (st.st_dev, st.st_ino)
    dev, ino = file_id
    return ClientRegion(reg_id, "system", key, start, size, path=path, dev=dev, ino=ino)


def test_a_file_shrunk_after_mapping_is_refused_not_faulted(key: str) -> None:
    regions = shm.RegionMap()
    reg = _registered(1, key, 12288, 4096)
    try:
        # A registration of 4 KiB at 12 KiB: the mapping starts on a page boundary.
        assert bytes(regions.client_view(reg, 64, 4)) == bytes([64, 65, 66, 67])
        os.truncate(f"/dev/shm{key}", 0)
        with pytest.raises(ValueError, match="smaller than its registration") as e:
            regions.client_view(reg, 64, 4)
        assert "the file holds 0 bytes, the request needs bytes [12352, 12356)" in str(e.value)
        os.truncate(f"/dev/shm{key}", 12288 + 1024)  # the span is back, the rest is not
        assert bytes(regions.client_view(reg, 0, 4)) == b"\0\0\0\0"
        with pytest.raises(ValueError, match="smaller than its registration"):
            regions.client_view(reg, 1000, 100)
    finally:
        regions.close()


def test_a_mapping_holds_one_descriptor_until_released(key: str) -> None:
    regions = shm.RegionMap()
    before = len(os.listdir("/proc/self/fd"))
    regions.client_view(_registered(7, key, 0, 4096), 0, 1).release()
    assert len(os.listdir("/proc/self/fd")) == before + 1  # the mmap's own: one per mapping
    regions.release_clients([7])
    assert len(os.listdir("/proc/self/fd")) == before
    regions.close()


def test_only_the_registered_object_is_mapped(key: str) -> None:
    """The broker names the object it registered (device, inode) and its own descriptor
    of it. Through the descriptor the worker reaches that object after the key is gone;
    by name (no descriptor it may open) it maps the key only while it is that object."""
    path = f"/dev/shm{key}"
    st = os.stat(path)
    file_id = (st.st_dev, st.st_ino)
    held = os.open(path, os.O_RDWR)  # the broker's descriptor
    regions = shm.RegionMap()
    try:
        os.unlink(path)
        Path(path).write_bytes(b"\xee" * 16384)  # another file under the key
        via_fd = f"/proc/{os.getpid()}/fd/{held}"
        through_fd = _registered(1, key, 0, 4096, via_fd, file_id)
        assert bytes(regions.client_view(through_fd, 1, 2)) == b"\x01\x02"
        with pytest.raises(ValueError, match="no longer matches its registration"):
            regions.client_view(_registered(2, key, 0, 4096, "", file_id), 1, 2)
        # by name, the file now under the key is mapped only if it is the one registered
        assert bytes(regions.client_view(_registered(3, key, 0, 4096), 1, 2)) == b"\xee\xee"
    finally:
        regions.close()
        os.close(held)
