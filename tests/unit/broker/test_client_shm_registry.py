"""The client region table: validation, bounds, and release only when unused."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.broker.client_shm_registry import RegionTable
from shoal.ipc.errors import Code, ServingError


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
    with pytest.raises(ServingError) as e:
        t.resolve("r", 1, 2**64 - 1)
    assert e.value.message == (
        "Integer overflow detected: byte_size (18446744073709551615) + offset (1) exceeds "
        "maximum value (18446744073709551615) for region 'r'"
    )
    with pytest.raises(ServingError, match="invalid args"):
        t.register_system("too_big", key, 200, 100)


def test_an_offset_past_the_region_is_reported_before_an_overflow(key: str) -> None:
    """Triton's GetMemoryInfo checks the offset first: its L0_shared_memory test sends
    offset 2**64 - 32 and expects 'Invalid offset', not an overflow."""
    t = RegionTable()
    t.register_system("r", key, 0, 64)
    with pytest.raises(ServingError, match="Invalid offset for shared memory region: 'r'"):
        t.resolve("r", 2**64 - 32, 64)


def test_unknown_names_are_not_found(key: str) -> None:
    t = RegionTable()
    with pytest.raises(ServingError) as e:
        t.resolve("nope", 0, 1)
    assert (e.value.code, e.value.message) == (
        Code.NOT_FOUND,
        "Unable to find shared memory region: 'nope'",
    )
    with pytest.raises(ServingError) as e:
        t.status("nope", "system")
    assert (e.value.code, e.value.message) == (
        Code.NOT_FOUND,
        "Unable to find system shared memory region: 'nope'",
    )
    with pytest.raises(ServingError, match="Unable to find cuda shared memory region: 'nope'"):
        t.status("nope", "cuda")
    t.register_system("r", key, 0, 64)
    with pytest.raises(ServingError) as e:
        t.status("r", "cuda")
    assert (e.value.code, e.value.message) == (
        Code.NOT_FOUND,
        "The region named 'r' is registered as system shared memory, not CUDA shared memory",
    )


def test_a_key_that_cannot_be_opened_is_internal() -> None:
    with pytest.raises(ServingError) as e:
        RegionTable().register_system("r", "/test_regions_absent", 0, 64)
    assert (e.value.code, e.value.message) == (
        Code.INTERNAL,
        "Unable to open shared memory region: '/test_regions_absent'",
    )


def test_unregister_while_in_use_keeps_the_region_until_its_last_request(key: str) -> None:
    """Triton's UnregisterHelper only marks a region in use (awaiting_unregister_): it is
    still listed, still usable, and its name still taken until the requests end."""
    t = RegionTable()
    r = t.register_system("r", key, 0, 256)
    t.acquire([r])
    assert t.unregister("r", "system") == []
    assert [x.name for x in t.status("", "system")] == ["r"]
    late = t.resolve("r", 0, 1)  # a new request may still use it
    t.acquire([late])
    with pytest.raises(ServingError, match="already in manager"):
        t.register_system("r", key, 0, 256)
    assert t.unregister("", "system") == []  # unregister-all marks it too: no error
    assert t.release([r.reg_id]) == []  # the late request still holds it
    assert t.release([r.reg_id]) == [r.reg_id]
    assert t.status("", "system") == []
    with pytest.raises(ServingError, match="Unable to find shared memory region: 'r'"):
        t.resolve("r", 0, 1)
    again = t.register_system("r", key, 0, 256)
    assert again.reg_id != r.reg_id
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
    with pytest.raises(ServingError) as e:
        t.register_cuda("r", b"x" * 63, 0, 64, gpu_count=1)  # over gRPC: Triton's open fails
    assert (e.value.code, e.value.message) == (
        Code.INVALID_ARG,
        "failed to register shared memory region 'r': invalid args",
    )
    with pytest.raises(ServingError, match="invalid args"):
        t.register_cuda("r", b"x" * 64, 1, 64, gpu_count=1)  # device 1 of a 1-GPU server
    with pytest.raises(ServingError) as e:
        t.register_cuda("r", b"x" * 63, 0, 64, gpu_count=0)  # before any other check
    assert (e.value.code, e.value.message) == (
        Code.INVALID_ARG,
        "failed to register CUDA shared memory region: 'r', GPUs not supported",
    )
    assert t.status("", "cuda") == []
    assert t.register_cuda("r", b"x" * 64, 0, 64, gpu_count=2).device_id == 0


def _fds_of(key: str) -> set[int]:
    """This process's descriptors of the shm object ``key``."""
    fds = set()
    for n in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{n}") == f"/dev/shm{key}":
                fds.add(int(n))
        except OSError:
            pass  # the descriptor listdir itself used
    return fds


def test_a_registration_holds_its_object_open_until_removed(key: str) -> None:
    """The table keeps a descriptor per system registration (the object stays reachable
    after the client unlinks its key), closes it when the registration goes, and leaks
    none when a registration is refused."""
    t = RegionTable()
    with pytest.raises(ServingError, match="invalid args"):
        t.register_system("too_big", key, 200, 100)
    assert _fds_of(key) == set()
    r = t.register_system("r", key, 0, 256)
    assert _fds_of(key) == {r.fd}
    t.acquire([r])
    assert t.unregister("r", "system") == []
    assert _fds_of(key) == {r.fd}  # in use: still held
    assert t.release([r.reg_id]) == [r.reg_id]
    assert _fds_of(key) == set()
    t.register_system("a", key, 0, 16)
    t.register_system("b", key, 16, 16)
    assert len(_fds_of(key)) == 2
    t.close()
    assert _fds_of(key) == set() and t.status("", "system") == []


def test_registrations_stop_short_of_the_descriptor_limit(key: str) -> None:
    t = RegionTable(max_system_regions=2)
    t.register_system("a", key, 0, 16)
    t.register_system("b", key, 16, 16)
    with pytest.raises(ServingError) as e:
        t.register_system("c", key, 32, 16)
    assert e.value.code == Code.UNAVAILABLE
    assert e.value.message == (
        "failed to register shared memory region 'c': the server holds 2 system shared "
        "memory regions, its limit"
    )
    assert len(_fds_of(key)) == 2
    assert t.unregister("a", "system")
    t.register_system("c", key, 32, 16)  # room again
    t.close()
