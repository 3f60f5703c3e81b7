"""The GPU worker's bookkeeping of CUDA IPC handles, on a host without a GPU.

cupy's runtime and the driver's allocation query are replaced by a fake device (the
only stand-ins: they are the hardware). What is checked is shoal's own logic: a handle
opened once however many registrations name it, closed with the last of them, and a
registration larger than its allocation refused without leaking the handle. The real
device path runs in tests/gpu (scripts/gpu-tests.sh).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from ipc.messages import ClientRegion
from workers import cuda_regions


class FakeDevice:
    """cupy.cuda.runtime's IPC calls over a table of allocations: handle -> size."""

    def __init__(self, allocations: dict[bytes, int]) -> None:
        self.allocations = allocations
        self.opened: dict[int, bytes] = {}  # pointer -> handle, while open
        self._next = 0x7000_0000

    def ipcOpenMemHandle(self, handle: bytes) -> int:
        assert handle not in self.opened.values(), "CUDA refuses a second open"
        self._next += 0x1000_0000
        self.opened[self._next] = handle
        return self._next

    def ipcCloseMemHandle(self, ptr: int) -> None:
        del self.opened[ptr]

    def bytes_after(self, ptr: int) -> int | None:
        handle = self.opened.get(ptr)
        return None if handle is None else self.allocations[handle]


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> FakeDevice:
    dev = FakeDevice({b"a" * 64: 4096, b"b" * 64: 64, b"?" * 64: 0})
    monkeypatch.setattr(cuda_regions, "_bytes_after", dev.bytes_after)
    return dev


def _regions(device: FakeDevice) -> cuda_regions.CudaRegions:
    regions = cuda_regions.CudaRegions(gpu=0)
    fake_cupy: Any = SimpleNamespace(cuda=SimpleNamespace(runtime=device))
    regions._cupy = lambda: fake_cupy  # type: ignore[method-assign]
    return regions


def _reg(reg_id: int, handle: bytes, byte_size: int) -> ClientRegion:
    return ClientRegion(reg_id, "cuda", byte_size=byte_size, raw_handle=handle)


def test_a_handle_is_opened_once_and_closed_with_its_last_registration(
    device: FakeDevice,
) -> None:
    regions = _regions(device)
    first = regions.pointer(_reg(1, b"a" * 64, 4096))
    assert regions.pointer(_reg(2, b"a" * 64, 1024)) == first  # same handle, same mapping
    assert len(device.opened) == 1
    regions.release([1])
    assert len(device.opened) == 1  # registration 2 still names it
    regions.release([2])
    assert device.opened == {}


def test_a_region_larger_than_its_allocation_is_refused_and_not_leaked(
    device: FakeDevice,
) -> None:
    regions = _regions(device)
    with pytest.raises(ValueError, match=r"larger than the device allocation .*\(64 bytes\)"):
        regions.pointer(_reg(1, b"b" * 64, 1 << 20))
    assert device.opened == {}
    assert regions.pointer(_reg(2, b"b" * 64, 64)) in device.opened  # a fitting one is fine


def test_an_allocation_of_unknown_size_is_refused(device: FakeDevice) -> None:
    regions = _regions(device)
    with pytest.raises(ValueError, match="cannot tell the size"):
        regions.pointer(_reg(1, b"?" * 64, 64))
    assert device.opened == {}


def test_an_id_reused_by_a_restarted_broker_for_another_handle_reopens(
    device: FakeDevice,
) -> None:
    regions = _regions(device)
    old = regions.pointer(_reg(1, b"a" * 64, 4096))
    new = regions.pointer(_reg(1, b"b" * 64, 64))  # a new broker numbers from 1 again
    assert new != old and list(device.opened) == [new]
    regions.close()
    assert device.opened == {}


def test_a_cpu_instance_or_another_gpu_refuses_before_touching_cuda(device: FakeDevice) -> None:
    with pytest.raises(ValueError, match="needs a KIND_GPU instance"):
        cuda_regions.CudaRegions(gpu=None).pointer(_reg(1, b"a" * 64, 64))
    with pytest.raises(ValueError, match="is on GPU 1, this instance on GPU 0"):
        _regions(device).pointer(ClientRegion(1, "cuda", device_id=1, raw_handle=b"a" * 64))
    assert device.opened == {}
