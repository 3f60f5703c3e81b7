"""Client CUDA shared memory in a GPU worker: Triton's CUDA shared-memory extension.

A client registers a ``cudaIpcMemHandle_t`` (64 bytes) for memory on one of its GPUs. A
worker whose instance runs on that GPU opens the handle once per registration (cupy's
``ipcOpenMemHandle``; a handle opened twice in one process fails, so it is cached) and
hands the model device arrays over the client's memory: no host copy on the way in or
out. The handle is closed when the broker says the registration is released.

Only GPU workers import cupy, and only when a CUDA region is used.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ipc.messages import ClientRegion


class CudaRegions:
    def __init__(self, gpu: int | None) -> None:
        self.gpu = gpu  # the physical GPU this worker sees (as its device 0)
        self._ptrs: dict[int, int] = {}

    def _cupy(self) -> Any:
        import cupy

        return cupy

    def pointer(self, region: ClientRegion) -> int:
        if self.gpu is None:
            raise ValueError(
                "CUDA shared memory needs a KIND_GPU instance; this instance runs on the CPU"
            )
        if region.device_id != self.gpu:
            raise ValueError(
                f"CUDA shared memory region is on GPU {region.device_id}, this instance on "
                f"GPU {self.gpu}"
            )
        ptr = self._ptrs.get(region.reg_id)
        if ptr is None:
            cp = self._cupy()
            ptr = int(cp.cuda.runtime.ipcOpenMemHandle(region.raw_handle))
            self._ptrs[region.reg_id] = ptr
        return ptr

    def array(
        self, region: ClientRegion, offset: int, nbytes: int, dtype: np.dtype, shape: list[int]
    ) -> Any:
        """A cupy array over ``nbytes`` at ``offset`` of the client's device memory."""
        if offset < 0 or nbytes < 0 or offset + nbytes > region.byte_size:
            raise ValueError(f"reference [{offset}, {offset + nbytes}) outside its region")
        cp = self._cupy()
        mem = cp.cuda.UnownedMemory(self.pointer(region) + offset, nbytes, owner=self)
        return cp.ndarray(shape, dtype=dtype, memptr=cp.cuda.MemoryPointer(mem, 0))

    def write(self, region: ClientRegion, offset: int, value: Any) -> int:
        """Copy an output (cupy or numpy array) into the client's device memory."""
        cp = self._cupy()
        src = value if isinstance(value, cp.ndarray) else cp.asarray(value)
        dest = self.array(region, offset, src.nbytes, src.dtype, list(src.shape))
        dest[...] = src
        cp.cuda.runtime.deviceSynchronize()  # the answer leaves only once the bytes landed
        return int(src.nbytes)

    def release(self, reg_ids: list[int]) -> None:
        for reg_id in reg_ids:
            ptr = self._ptrs.pop(reg_id, None)
            if ptr is not None:
                self._cupy().cuda.runtime.ipcCloseMemHandle(ptr)

    def close(self) -> None:
        self.release(list(self._ptrs))
