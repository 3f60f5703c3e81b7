"""Client CUDA shared memory in a worker: Triton's CUDA shared-memory extension.

A client registers a ``cudaIpcMemHandle_t`` (64 bytes) for memory on one of its GPUs. A
worker whose instance runs on that GPU opens the handle once (cupy's
``runtime.ipcOpenMemHandle``) and hands the model device arrays over the client's
memory: no host copy on the way in or out. A CPU instance opens it on the region's GPU
(it sees all of the server's) and copies through the host, as Triton does for a model on
the CPU: inputs come as host copies, outputs are copied up. The broker sends a GPU
instance only requests in its own GPU's memory. CUDA does not let one process open the
same handle twice, so an opened handle is shared by every registration that names it and
closed (``runtime.ipcCloseMemHandle``) when the broker says the last of them is released.

Registration ids are the broker's: a restarted broker numbers from 1 again, so a cached
id is trusted only while it still names the same handle.

When it first opens a handle the worker asks the driver how large the allocation behind
it is (``cuMemGetAddressRange``): a registration whose byte_size runs past it is refused,
or the client's word alone would let a request read or write another allocation's
device memory.

Copies in and out are plain memcpys (no cupy kernel, so no NVRTC compile on this path).
cupy is imported only when a CUDA region is used (a CPU instance without CUDA clients
never loads it).
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import numpy as np

from shoal.ipc.messages import ClientRegion

log = logging.getLogger("shoal.worker")


def _bytes_after(ptr: int) -> int | None:
    """How many bytes of its allocation lie at and after device pointer ``ptr`` (the
    driver's cuMemGetAddressRange), or None when the driver cannot say."""
    try:
        query = ctypes.CDLL("libcuda.so.1").cuMemGetAddressRange_v2
    except (OSError, AttributeError):
        return None
    query.argtypes = [
        ctypes.POINTER(ctypes.c_ulonglong),
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_ulonglong,
    ]
    query.restype = ctypes.c_int
    base, size = ctypes.c_ulonglong(), ctypes.c_size_t()
    status = query(ctypes.byref(base), ctypes.byref(size), ctypes.c_ulonglong(ptr))
    if status != 0:  # the code names the cause (CUresult) where the request cannot
        log.warning("cuMemGetAddressRange on 0x%x failed: CUresult %d", ptr, status)
        return None
    return int(base.value + size.value - ptr)


class CudaRegions:
    def __init__(self, gpu: int | None) -> None:
        # The server's id of the one GPU this worker sees (as its device 0); None for a
        # CPU instance, which sees every GPU of the server, by the server's ids.
        self.gpu = gpu
        self._handle_of: dict[int, bytes] = {}  # registration id -> its raw handle
        # raw handle -> [pointer, registrations, bytes of its allocation from the pointer,
        # the device (this process's index) it was opened on]
        self._opened: dict[bytes, list[int]] = {}

    def _cupy(self) -> Any:
        import cupy

        return cupy

    def _device(self, region: ClientRegion) -> int:
        """This process's index of the GPU the region is on."""
        if self.gpu is None:
            return region.device_id
        if region.device_id != self.gpu:
            raise ValueError(
                f"CUDA shared memory region is on GPU {region.device_id}, this instance on "
                f"GPU {self.gpu}"
            )
        return 0

    def pointer(self, region: ClientRegion) -> int:
        """The base of the region's device memory in this process (opened on first use,
        on the region's GPU)."""
        handle = bytes(region.raw_handle)
        known = self._handle_of.get(region.reg_id)
        if known is not None and known != handle:
            self.release([region.reg_id])  # an id an earlier broker gave another region
            known = None
        if known is None:
            entry = self._opened.get(handle)
            if entry is None:
                device = self._device(region)
                with self._on(region):
                    ptr = int(self._cupy().cuda.runtime.ipcOpenMemHandle(handle))
                    try:
                        size = _bytes_after(ptr)
                    except BaseException:
                        self._close_pointer(ptr, device)
                        raise
                if not size:  # an allocation of unknown size is refused, as by Triton
                    self._close_pointer(ptr, device)
                    raise ValueError(
                        "cannot tell the size of the device allocation behind the CUDA "
                        "shared memory handle"
                    )
                entry = self._opened[handle] = [ptr, 0, size, device]
            if region.byte_size > entry[2]:
                if not entry[1]:
                    self._close(handle)
                raise ValueError(
                    f"CUDA shared memory region of {region.byte_size} bytes is larger than "
                    f"the device allocation its handle names ({entry[2]} bytes)"
                )
            entry[1] += 1
            self._handle_of[region.reg_id] = handle
        return self._opened[handle][0]

    def _on(self, region: ClientRegion) -> Any:
        """The region's GPU made current, for a ``with`` block (checked first: nothing
        touches CUDA for a region this instance cannot reach)."""
        device = self._device(region)
        return self._cupy().cuda.Device(device)

    def _memptr(self, region: ClientRegion, offset: int, nbytes: int) -> Any:
        """A cupy MemoryPointer to ``nbytes`` at ``offset`` of the client's device memory
        (the region's device current)."""
        if offset < 0 or nbytes < 0 or offset + nbytes > region.byte_size:
            raise ValueError(f"reference [{offset}, {offset + nbytes}) outside its region")
        base = self.pointer(region)
        cp = self._cupy()
        device = self._device(region)
        mem = cp.cuda.UnownedMemory(base + offset, nbytes, owner=self, device_id=device)
        return cp.cuda.MemoryPointer(mem, 0)

    def array(
        self, region: ClientRegion, offset: int, nbytes: int, dtype: np.dtype, shape: list[int]
    ) -> Any:
        """A cupy array over ``nbytes`` at ``offset`` of the client's device memory; on a
        CPU instance, a numpy copy of those bytes."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if count * dtype.itemsize != nbytes:
            raise ValueError(f"{nbytes} bytes cannot hold a {dtype} tensor of shape {shape}")
        with self._on(region):
            memptr = self._memptr(region, offset, nbytes)
            arr = self._cupy().ndarray(shape, dtype=dtype, memptr=memptr)
            return arr if self.gpu is not None else arr.get()  # get(): a synchronous copy

    def host_bytes(self, region: ClientRegion, offset: int, nbytes: int) -> memoryview:
        """A host copy of ``nbytes`` at ``offset`` of the client's device memory (a
        serialized BYTES tensor: no model reads those on the device)."""
        host = np.empty(nbytes, dtype=np.uint8)
        with self._on(region):
            src = self._memptr(region, offset, nbytes)
            if nbytes:
                src.copy_to_host(host.ctypes.data_as(ctypes.c_void_p), nbytes)  # synchronous
        return host.data

    def write(self, region: ClientRegion, offset: int, value: Any) -> int:
        """Copy an output (cupy or numpy array) into the client's device memory; the bytes
        have landed when this returns."""
        if getattr(getattr(value, "dtype", None), "kind", "") == "O":
            raise ValueError("a BYTES tensor goes to CUDA shared memory serialized")
        nbytes = int(value.nbytes)
        cp = self._cupy()
        with self._on(region):
            dest = self._memptr(region, offset, nbytes)
            if nbytes == 0:
                return 0
            if isinstance(value, cp.ndarray):
                src = cp.ascontiguousarray(value)  # a kernel only for a strided view
                dest.copy_from_device(src.data, nbytes)
            else:
                host = np.ascontiguousarray(value)
                dest.copy_from_host(host.ctypes.data_as(ctypes.c_void_p), nbytes)
            cp.cuda.runtime.deviceSynchronize()  # the answer leaves once the bytes landed
        return nbytes

    def release(self, reg_ids: list[int]) -> None:
        """The broker released these registrations: close handles nothing names any more."""
        for reg_id in reg_ids:
            handle = self._handle_of.pop(reg_id, None)
            entry = self._opened.get(handle) if handle is not None else None
            if handle is None or entry is None:
                continue
            entry[1] -= 1
            if entry[1] <= 0:
                self._close(handle)

    def _close(self, handle: bytes) -> None:
        ptr, _, _, device = self._opened.pop(handle)
        self._close_pointer(ptr, device)

    def _close_pointer(self, ptr: int, device: int) -> None:
        try:
            cp = self._cupy()
            with cp.cuda.Device(device):
                cp.cuda.runtime.ipcCloseMemHandle(ptr)
        except Exception as exc:  # a failed close must not take the worker down
            log.warning("closing a CUDA shared memory handle failed: %s", exc)

    def close(self) -> None:
        self.release(list(self._handle_of))
