"""A worker's bookkeeping of CUDA IPC handles, on a host without a GPU.

cupy's runtime and the driver's allocation query are replaced by a fake device (the
only stand-ins: they are the hardware). What is checked is shoal's own logic: a handle
opened once however many registrations name it, on the right GPU, closed with the last
of them, and a registration larger than its allocation refused without leaking the
handle. The real device path runs in tests/gpu (scripts/gpu-tests.sh).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from shoal.ipc.messages import ClientRegion
from shoal.workers import cuda_regions


class FakeDevice:
    """cupy.cuda.runtime's IPC calls over a table of allocations: handle -> size, and
    cupy.cuda.Device's choice of the current GPU (as an IPC handle is opened on it)."""

    def __init__(self, allocations: dict[bytes, int]) -> None:
        self.allocations = allocations
        self.opened: dict[int, bytes] = {}  # pointer -> handle, while open
        self.opened_on: dict[int, int] = {}  # pointer -> the current GPU at its open
        self.current = 5  # whatever it was: shoal must choose, not find, the right one
        self._next = 0x7000_0000
        self.copies: list[tuple[str, int, int, int]] = []  # (kind, address, bytes, GPU)

    def ipcOpenMemHandle(self, handle: bytes) -> int:
        assert handle not in self.opened.values(), "CUDA refuses a second open"
        self._next += 0x1000_0000
        self.opened[self._next] = handle
        self.opened_on[self._next] = self.current
        return self._next

    def ipcCloseMemHandle(self, ptr: int) -> None:
        assert self.opened_on.pop(ptr) == self.current, "closed on another GPU"
        del self.opened[ptr]

    def deviceSynchronize(self) -> None:
        pass

    def memory(self, ptr: int, size: int, owner: object, device_id: int) -> FakePointer:
        return FakePointer(self, ptr, size, device_id)

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


@dataclasses.dataclass
class FakePointer:
    """cupy's UnownedMemory and MemoryPointer over it (offset 0)."""

    dev: FakeDevice
    ptr: int
    size: int
    device_id: int

    def copy_from_host(self, src: object, nbytes: int) -> None:
        self.dev.copies.append(("up", self.ptr, nbytes, self.dev.current))


class FakeArray:
    """cupy.ndarray over a FakePointer."""

    def __init__(self, shape: list[int], dtype: np.dtype, memptr: FakePointer) -> None:
        self.shape, self.dtype, self.memptr = shape, dtype, memptr

    def get(self) -> np.ndarray:
        dev = self.memptr.dev
        dev.copies.append(("down", self.memptr.ptr, self.memptr.size, dev.current))
        return np.zeros(self.shape, self.dtype)


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> FakeDevice:
    dev = FakeDevice({b"a" * 64: 4096, b"b" * 64: 64, b"?" * 64: 0})
    monkeypatch.setattr(cuda_regions, "_bytes_after", dev.bytes_after)
    return dev


def _regions(device: FakeDevice, gpu: int | None = 0) -> cuda_regions.CudaRegions:
    regions = cuda_regions.CudaRegions(gpu)
    cuda = SimpleNamespace(
        runtime=device,
        Device=device.use,
        UnownedMemory=device.memory,
        MemoryPointer=lambda mem, offset: mem,
    )
    fake_cupy: Any = SimpleNamespace(cuda=cuda, ndarray=FakeArray)
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
    assert device.current == 5  # put back after each open
    regions.release([1, 2])  # the fake asserts each close is on the GPU of its open
    assert device.opened == {}


def test_a_cpu_instance_copies_down_and_up_on_the_regions_gpu(device: FakeDevice) -> None:
    regions = _regions(device, gpu=None)
    region = _reg(1, b"a" * 64, 4096, device_id=2)
    got = regions.array(region, 1024, 64, np.dtype("<f4"), [4, 4])
    assert isinstance(got, np.ndarray) and got.shape == (4, 4)  # a host copy, not cupy's
    assert regions.write(region, 2048, np.ones(8, dtype=np.float32)) == 32
    (base,) = device.opened
    assert device.copies == [("down", base + 1024, 64, 2), ("up", base + 2048, 32, 2)]
    with pytest.raises(ValueError, match="outside its region"):
        regions.write(region, 4090, np.ones(8, dtype=np.float32))
    assert len(device.copies) == 2  # refused before any copy


def test_a_gpu_instance_hands_the_model_the_device_array(device: FakeDevice) -> None:
    regions = _regions(device, gpu=3)
    got = regions.array(_reg(1, b"a" * 64, 4096, device_id=3), 0, 64, np.dtype("<f4"), [16])
    assert isinstance(got, FakeArray) and got.memptr.device_id == 0
    assert device.copies == []  # no host copy
