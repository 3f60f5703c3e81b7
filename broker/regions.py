"""The server's table of client-registered shared-memory regions (one for every frontend).

Triton's system (and CUDA) shared-memory extension: a client registers a region once
(name -> key, offset, byte_size) and then sends references into it. Every reference is
bounds-checked here, with overflow-safe arithmetic, before any worker touches a byte.

Lifetime: each registration gets a fresh id; requests in flight hold a reference count on
it. Unregistering removes the name at once (new requests fail) but the registration lives
until its last request ends; then ``release`` hands its id back so workers unmap it.
System and CUDA regions share one namespace, as in Triton.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from ipc.errors import Code, ServingError, invalid_arg
from ipc.shm import PREFIX as INTERNAL_PREFIX

SHM_DIR: Final = Path("/dev/shm")
TRITON_RESERVED_PREFIX: Final = "triton_python_backend_shm_region_"
_KEY_NAME: Final = re.compile(r"^[^/\0]+$")
CUDA_HANDLE_BYTES: Final = 64

Kind = Literal["system", "cuda"]


@dataclass
class Region:
    reg_id: int
    name: str
    kind: Kind
    key: str = ""  # system: the shm key as registered
    offset: int = 0  # system: where the region starts inside the shm object
    byte_size: int = 0
    device_id: int = 0  # cuda
    raw_handle: bytes = b""  # cuda: cudaIpcMemHandle_t
    users: int = 0  # requests in flight that reference it
    unregistered: bool = False


def _check_key(name: str, key: str) -> str:
    """The /dev/shm file name for ``key``, or Triton's error for a bad key."""
    bare = key.lstrip("/")
    for reserved in (TRITON_RESERVED_PREFIX, INTERNAL_PREFIX):
        if bare.startswith(reserved):
            raise invalid_arg(
                f"cannot register shared memory region '{name}' with key '{key}' as the key "
                f"contains the reserved prefix '{reserved}'"
            )
    if not bare or not _KEY_NAME.match(bare) or bare in (".", ".."):
        raise invalid_arg(
            f"cannot register shared memory region '{name}' - invalid shm key '{key}'"
        )
    return bare


class RegionTable:
    def __init__(self) -> None:
        self.by_name: dict[str, Region] = {}
        self.by_id: dict[int, Region] = {}
        self._next_id = 1

    def _new(self, region: Region) -> None:
        if region.name in self.by_name:
            raise ServingError(
                Code.ALREADY_EXISTS, f"shared memory region '{region.name}' already in manager"
            )
        self.by_name[region.name] = region
        self.by_id[region.reg_id] = region
        self._next_id += 1

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> Region:
        if name in self.by_name:
            raise ServingError(
                Code.ALREADY_EXISTS, f"shared memory region '{name}' already in manager"
            )
        bare = _check_key(name, key)
        invalid = invalid_arg(f"failed to register shared memory region '{name}': invalid args")
        if offset < 0 or byte_size <= 0:
            raise invalid
        try:
            # Non-blocking: a FIFO planted in /dev/shm must not hang the broker.
            fd = os.open(SHM_DIR / bare, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError:
            raise invalid_arg(f"Unable to open shared memory region: '{key}'") from None
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if not stat.S_ISREG(st.st_mode) or offset + byte_size > st.st_size:
            raise invalid
        region = Region(self._next_id, name, "system", key, offset, byte_size)
        self._new(region)
        return region

    def register_cuda(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int, gpu_count: int
    ) -> Region:
        if name in self.by_name:
            raise ServingError(
                Code.ALREADY_EXISTS, f"shared memory region '{name}' already in manager"
            )
        if len(raw_handle) != CUDA_HANDLE_BYTES:
            raise invalid_arg(
                f"failed to register CUDA shared memory region '{name}': invalid args (the raw "
                f"handle must be {CUDA_HANDLE_BYTES} bytes, got {len(raw_handle)})"
            )
        if gpu_count == 0:
            raise ServingError(
                Code.UNSUPPORTED,
                f"failed to register CUDA shared memory region '{name}': this server has no GPU",
            )
        if not 0 <= device_id < gpu_count or byte_size <= 0:
            raise invalid_arg(
                f"failed to register CUDA shared memory region '{name}': invalid args"
            )
        region = Region(
            self._next_id,
            name,
            "cuda",
            byte_size=byte_size,
            device_id=device_id,
            raw_handle=raw_handle,
        )
        self._new(region)
        return region

    def unregister(self, name: str, kind: Kind) -> list[int]:
        """Unregister ``name`` (every region of ``kind`` when ""); returns the ids that
        can be released at once (no request in flight holds them)."""
        names = [name] if name else [n for n, r in self.by_name.items() if r.kind == kind]
        released = []
        for n in names:
            region = self.by_name.get(n)
            if region is None or region.kind != kind:
                continue
            del self.by_name[n]
            region.unregistered = True
            if region.users == 0:
                del self.by_id[region.reg_id]
                released.append(region.reg_id)
        return released

    def status(self, name: str, kind: Kind) -> list[Region]:
        if name:
            region = self.by_name.get(name)
            if region is None or region.kind != kind:
                what = "system" if kind == "system" else "CUDA"
                raise invalid_arg(f"Unable to find {what} shared memory region: '{name}'")
            return [region]
        return sorted((r for r in self.by_name.values() if r.kind == kind), key=lambda r: r.name)

    def resolve(self, name: str, offset: int, nbytes: int) -> Region:
        """The region a tensor references, checked: the span must lie inside it."""
        region = self.by_name.get(name)
        if region is None:
            raise invalid_arg(f"Unable to find system shared memory region: '{name}'")
        if offset < 0 or offset >= region.byte_size:
            raise invalid_arg(f"Invalid offset for shared memory region: '{name}'")
        if nbytes < 0 or nbytes > region.byte_size - offset:
            if nbytes > 2**63 - 1 - offset:
                raise invalid_arg(
                    f"Integer overflow detected: byte_size {nbytes} with offset "
                    f"{offset} for shared memory region: '{name}'"
                )
            raise invalid_arg(f"Invalid offset + byte size for shared memory region: '{name}'")
        return region

    def acquire(self, regions: list[Region]) -> None:
        for r in regions:
            r.users += 1

    def release(self, reg_ids: list[int]) -> list[int]:
        """Requests using these ids ended; returns ids now free to unmap everywhere."""
        freed = []
        for reg_id in reg_ids:
            region = self.by_id.get(reg_id)
            if region is None:
                continue
            region.users -= 1
            if region.users <= 0 and region.unregistered:
                del self.by_id[reg_id]
                freed.append(reg_id)
        return freed
