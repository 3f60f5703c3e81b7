"""The client region table: validation, bounds, and release only when unused."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.regions import RegionTable
from ipc.errors import ServingError


@pytest.fixture
def key() -> Iterator[str]:
    path = Path(f"/dev/shm/test_regions_{os.getpid()}")
    path.write_bytes(b"\0" * 256)
    yield f"/{path.name}"
    path.unlink()


def test_bounds_are_checked_on_every_reference(key: str) -> None:
    t = RegionTable()
    t.register_system("r", key, 64, 128)
    assert t.resolve("r", 0, 128).byte_size == 128
    with pytest.raises(ServingError, match="Invalid offset for shared memory region: 'r'"):
        t.resolve("r", 128, 1)
    with pytest.raises(ServingError, match="Invalid offset \\+ byte size"):
        t.resolve("r", 64, 65)
    with pytest.raises(ServingError, match="Integer overflow detected"):
        t.resolve("r", 1, 2**63)
    with pytest.raises(ServingError, match="invalid args"):
        t.register_system("too_big", key, 200, 100)


def test_unregister_while_in_use_defers_the_release(key: str) -> None:
    t = RegionTable()
    r = t.register_system("r", key, 0, 256)
    t.acquire([r])
    assert t.unregister("r", "system") == []  # in use: kept alive, name gone
    with pytest.raises(ServingError, match="Unable to find system shared memory region"):
        t.resolve("r", 0, 1)
    again = t.register_system("r", key, 0, 256)  # the name can be reused at once
    assert again.reg_id != r.reg_id
    assert t.release([r.reg_id]) == [r.reg_id]
    assert t.unregister("", "system") == [again.reg_id]


def test_cuda_and_system_share_one_namespace(key: str) -> None:
    t = RegionTable()
    t.register_system("r", key, 0, 64)
    with pytest.raises(ServingError, match="already in manager"):
        t.register_cuda("r", b"x" * 64, 0, 64, gpu_count=1)
    assert t.status("", "cuda") == []
    assert t.unregister("r", "cuda") == []  # a system region is not touched
    assert [x.name for x in t.status("", "system")] == ["r"]


def test_cuda_registration_checks_handle_device_and_gpu() -> None:
    t = RegionTable()
    with pytest.raises(ServingError, match="raw handle must be 64 bytes, got 63") as e:
        t.register_cuda("r", b"x" * 63, 0, 64, gpu_count=1)
    assert e.value.code.name == "INVALID_ARG"
    with pytest.raises(ServingError, match="invalid args"):
        t.register_cuda("r", b"x" * 64, 1, 64, gpu_count=1)  # device 1 of a 1-GPU server
    with pytest.raises(ServingError, match="this server has no GPU") as e:
        t.register_cuda("r", b"x" * 64, 0, 64, gpu_count=0)
    assert e.value.code.name == "UNSUPPORTED"
    assert t.status("", "cuda") == []
    assert t.register_cuda("r", b"x" * 64, 0, 64, gpu_count=2).device_id == 0
