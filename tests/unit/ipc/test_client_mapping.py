"""A worker's mapping of a client region: the client may shrink its file at any time."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipc import shm


@pytest.fixture
def key() -> Iterator[str]:
    path = Path(f"/dev/shm/test_client_mapping_{os.getpid()}")
    path.write_bytes(bytes(range(256)) * 64)  # 16 KiB
    yield f"/{path.name}"
    path.unlink(missing_ok=True)


def test_a_file_shrunk_after_mapping_is_refused_not_faulted(key: str) -> None:
    regions = shm.RegionMap()
    try:
        # A registration of 4 KiB at 12 KiB: the mapping starts on a page boundary.
        assert bytes(regions.client_view(1, key, 12288, 4096, 64, 4)) == bytes([64, 65, 66, 67])
        os.truncate(f"/dev/shm{key}", 0)
        with pytest.raises(ValueError, match="smaller than its registration") as e:
            regions.client_view(1, key, 12288, 4096, 64, 4)
        assert "the file holds 0 bytes, the request needs bytes [12352, 12356)" in str(e.value)
        os.truncate(f"/dev/shm{key}", 12288 + 1024)  # the span is back, the rest is not
        assert bytes(regions.client_view(1, key, 12288, 4096, 0, 4)) == b"\0\0\0\0"
        with pytest.raises(ValueError, match="smaller than its registration"):
            regions.client_view(1, key, 12288, 4096, 1000, 100)
    finally:
        regions.close()


def test_a_mapping_holds_one_descriptor_until_released(key: str) -> None:
    regions = shm.RegionMap()
    before = len(os.listdir("/proc/self/fd"))
    regions.client_view(7, key, 0, 4096, 0, 1).release()
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
        assert bytes(regions.client_view(1, key, 0, 4096, 1, 2, via_fd, file_id)) == b"\x01\x02"
        with pytest.raises(ValueError, match="no longer matches its registration"):
            regions.client_view(2, key, 0, 4096, 1, 2, "", file_id)
        assert bytes(regions.client_view(3, key, 0, 4096, 1, 2)) == b"\xee\xee"  # no id given
    finally:
        regions.close()
        os.close(held)
