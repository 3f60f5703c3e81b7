"""A worker's bookkeeping of CUDA IPC handles, on a host without a GPU.

cupy's runtime and the driver's allocation query are replaced by a fake device (the
only stand-ins: they are the hardware). What is checked is shoal's own logic: a handle
opened once however many registrations name it, on the right GPU, closed with the last
of them, and a registration larger than its allocation refused without leaking the
handle. The real device path runs in tests/gpu (scripts/gpu-tests.sh).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from ipc.messages import ClientRegion
from workers import cuda_regions


class FakeDevice:
    """cupy.cuda.runtime's IPC calls over a table of allocations: handle -> size, and
    cupy.cuda.Device's choice of the current GPU (as an IPC handle is opened on it)."""

    def __init__(self, allocations: dict[bytes, int]) -> None:
        self.allocations = allocations
        self.opened: dict[int, bytes] = {}  # pointer -> handle, while open
        self.opened_on: dict[int, int] = {}  # pointer -> the current GPU at its open
        self.current = 0
        self._next = 0x7000_0000

    def ipcOpenMemHandle(self, handle: bytes) -> int:
        assert handle not in self.opened.values(), "CUDA refuses a second open"
        self._next += 0x1000_0000
        self.opened[self._next] = handle
        self.opened_on[self._next] = self.current
        return self._next

    def ipcCloseMemHandle(self, ptr: int) -> None:
        assert self.opened_on.pop(ptr) == self.current, "closed on another GPU"
        del self.opened[ptr]

    @contextlib.contextmanager
    def use(self, index: int) -> Iterator[None]:
        before, self.current = self.current, index
        try:
            yield
        finally:
            self.current = before

    def bytes_after(self, ptr: int) -> int | None:
        handle = self.opened.get(ptr)
        return None if handle is None else self.allocations[handle]


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> FakeDevice:
    dev = FakeDevice({b"a" * 64: 4096, b"b" * 64: 64, b"?" * 64: 0})
    monkeypatch.setattr(cuda_regions, "_bytes_after", dev.bytes_after)
    return dev


def _regions(device: FakeDevice, gpu: int | None = 0) -> cuda_regions.CudaRegions:
    regions = cuda_regions.CudaRegions(gpu)
    fake_cupy: Any = SimpleNamespace(cuda=SimpleNamespace(runtime=device, Device=device.use))
    regions._cupy = lambda: fake_cupy  # type: ignore[method-assign]
    return regions


def _reg(reg_id: int, handle: bytes, byte_size: int, device_id: int = 0) -> ClientRegion:
    return ClientRegion(reg_id, "cuda", byte_size=byte_size, device_id=device_id, raw_handle=handle)


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


def test_another_gpus_region_is_refused_before_touching_cuda(device: FakeDevice) -> None:
    with pytest.raises(ValueError, match="is on GPU 1, this instance on GPU 0"):
        _regions(device).pointer(_reg(1, b"a" * 64, 64, device_id=1))
    assert device.opened == {}


def test_a_gpu_instance_opens_on_its_own_device_the_only_one_it_sees(
    device: FakeDevice,
) -> None:
    regions = _regions(device, gpu=3)  # server GPU 3 is this process's device 0
    ptr = regions.pointer(_reg(1, b"a" * 64, 64, device_id=3))
    assert device.opened_on[ptr] == 0
    regions.close()
    assert device.opened == {}


def test_a_cpu_instance_opens_each_region_on_the_regions_gpu(device: FakeDevice) -> None:
    """A CPU instance sees every GPU of the server and copies through the host: each
    handle is opened (and later closed) with its own GPU current."""
    regions = _regions(device, gpu=None)
    on2 = regions.pointer(_reg(1, b"a" * 64, 64, device_id=2))
    on1 = regions.pointer(_reg(2, b"b" * 64, 64, device_id=1))
    assert device.opened_on == {on2: 2, on1: 1}
    assert device.current == 0  # put back after each open
    regions.release([1, 2])  # the fake asserts each close is on the GPU of its open
    assert device.opened == {}
