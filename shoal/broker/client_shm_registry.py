"""The registry of client shared-memory regions: what the broker keeps about each region a
client registered (one table for every frontend). Its messages to and from the frontends go
through shoal/broker/client_shm_requests.py.

Triton's system (and CUDA) shared-memory extension: a client registers a region once
(name -> key, offset, byte_size) and then sends references into it. Every reference is
bounds-checked here, with overflow-safe arithmetic, before any worker touches a byte.

Lifetime: each registration gets a fresh id; requests in flight hold a reference count on
it. Unregistering a region no request holds removes it at once. Unregistering one in use
succeeds but, as in Triton's UnregisterHelper, only marks it: it stays registered (status
lists it, new requests may still use it, its name cannot be registered again) until its
last request ends; then ``release`` removes it and hands its id back so workers unmap it.
System and CUDA regions share one namespace, as in Triton.

A system registration keeps the shm object open from registration to removal, as Triton
keeps its mapping: a client may unlink the key (or replace the file) once registered, and
its requests still reach the object it registered. Workers open that object through the
broker's descriptor (``/proc/<broker pid>/fd/<n>``), by key only where they may not, and
map it only if it is that object (same device and inode).

Messages and codes are Triton's (src/shared_memory_manager.cc).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from shoal.ipc.errors import Code, ServingError, invalid_arg
from shoal.ipc.messages import CUDA_HANDLE_BYTES
from shoal.ipc.shm import PREFIX as INTERNAL_PREFIX

SHM_DIR: Final = Path("/dev/shm")
TRITON_RESERVED_PREFIX: Final = "triton_python_backend_shm_region_"
_KEY_NAME: Final = re.compile(r"^[^/\0]+$")
SIZE_MAX: Final = 2**64 - 1  # Triton's offsets and sizes are size_t

Kind = Literal["system", "cuda"]
_SPELLED: Final[dict[str, str]] = {"system": "system", "cuda": "CUDA"}  # as Triton writes them


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
    fd: int = -1  # system: the broker's descriptor of the shm object, held until removal
    dev: int = 0  # system: the object's st_dev and st_ino
    ino: int = 0
    users: int = 0  # requests in flight that reference it
    unregistered: bool = False  # awaiting its last request (Triton's awaiting_unregister_)


def _check_key(name: str, key: str) -> str:
    """The /dev/shm file name for ``key``, or Triton's error for a bad key."""
    bare = key.lstrip("/")
    for reserved in (TRITON_RESERVED_PREFIX, INTERNAL_PREFIX):
        if bare.startswith(reserved):
            raise invalid_arg(
                f"cannot register shared memory region '{name}' with key '{key}' as the key "
                f"contains the reserved prefix '{reserved}'"
            )
    if not bare:
        raise invalid_arg(
            f"cannot register shared memory region '{name}' - invalid shm key '{key}'"
        )
    if not _KEY_NAME.match(bare) or bare in (".", ".."):
        # A name shm_open refuses (a '/' inside, '.', '..'): Triton's answer is then
        # shm_open's failure. Refused here, before any path is built from it.
        raise _cannot_open(key)
    return bare


def _cannot_open(key: str) -> ServingError:
    return ServingError(Code.INTERNAL, f"Unable to open shared memory region: '{key}'")


def _already_registered(name: str) -> ServingError:
    return ServingError(Code.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")


def _open_object(key: str, bare: str) -> tuple[int, os.stat_result]:
    """A descriptor of the shm object ``key`` and its status; the caller owns the
    descriptor.

    Opened read-write, as Triton's shm_open(O_RDWR) does: a file the server could only
    read would register fine and then fail when a worker maps it to write an output."""
    try:
        # Non-blocking: a FIFO planted in /dev/shm must not hang the broker.
        fd = os.open(SHM_DIR / bare, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        raise _cannot_open(key) from None
    try:
        return fd, os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise


class RegionTable:
    def __init__(self, max_system_regions: int = 2**20) -> None:
        """``max_system_regions``: how many system registrations (each holds a
        descriptor) this process has room for (ipc.lifecycle.raise_open_file_limit)."""
        self.by_name: dict[str, Region] = {}
        self.by_id: dict[int, Region] = {}
        self._next_id = 1
        self._open_fds = 0
        self.max_system_regions = max_system_regions

    def _new(self, region: Region) -> None:
        if region.name in self.by_name:
            raise _already_registered(region.name)
        self.by_name[region.name] = region
        self.by_id[region.reg_id] = region
        self._next_id += 1

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> Region:
        bare = _check_key(name, key)
        if name in self.by_name:
            raise _already_registered(name)
        invalid = invalid_arg(f"failed to register shared memory region '{name}': invalid args")
        if offset < 0 or byte_size < 0:
            raise invalid
        if self._open_fds >= self.max_system_regions:
            raise ServingError(
                Code.UNAVAILABLE,
                f"failed to register shared memory region '{name}': the server holds "
                f"{self._open_fds} system shared memory regions, its limit",
            )
        fd, st = _open_object(key, bare)
        try:
            if not stat.S_ISREG(st.st_mode) or offset + byte_size > st.st_size:
                raise invalid
            if byte_size == 0:  # in range, but Triton's mmap of nothing fails: its words
                raise invalid_arg(
                    f"failed to register shared memory region '{name}': unable to process "
                    "address spaceInvalid argument"
                )
            region = Region(self._next_id, name, "system", key, offset, byte_size)
            region.fd, region.dev, region.ino = fd, st.st_dev, st.st_ino
            self._new(region)
        except BaseException:
            os.close(fd)
            raise
        self._open_fds += 1
        return region

    def register_cuda(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int, gpu_count: int
    ) -> Region:
        if gpu_count == 0:
            # What a Triton built without GPU support answers, before looking at anything.
            raise invalid_arg(
                f"failed to register CUDA shared memory region: '{name}', GPUs not supported"
            )
        if name in self.by_name:
            raise _already_registered(name)
        # A handle of another size comes only over gRPC (HTTP checks it first, in its own
        # words): Triton's gRPC casts the bytes to a handle, whose open then fails.
        if len(raw_handle) != CUDA_HANDLE_BYTES or not 0 <= device_id < gpu_count:
            # a byte_size of 0 passes Triton's size check too
            raise invalid_arg(f"failed to register shared memory region '{name}': invalid args")
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
        can be released at once (no request in flight holds them). A region in use is
        only marked; ``release`` removes it when its last request ends."""
        names = [name] if name else [n for n, r in self.by_name.items() if r.kind == kind]
        released = []
        for n in names:
            region = self.by_name.get(n)
            if region is None or region.kind != kind:
                continue
            region.unregistered = True
            if region.users == 0:
                self._remove(region)
                released.append(region.reg_id)
        return released

    def _remove(self, region: Region) -> None:
        del self.by_name[region.name]
        del self.by_id[region.reg_id]
        if region.fd >= 0:
            os.close(region.fd)
            region.fd = -1
            self._open_fds -= 1

    def close(self) -> None:
        """Drop every registration (the broker is stopping)."""
        for region in list(self.by_name.values()):
            self._remove(region)

    def status(self, name: str, kind: Kind) -> list[Region]:
        if not name:
            return sorted(
                (r for r in self.by_name.values() if r.kind == kind), key=lambda r: r.name
            )
        region = self.by_name.get(name)
        if region is None:
            raise ServingError(
                Code.NOT_FOUND, f"Unable to find {kind} shared memory region: '{name}'"
            )
        if region.kind != kind:
            raise ServingError(
                Code.NOT_FOUND,
                f"The region named '{name}' is registered as {_SPELLED[region.kind]} shared "
                f"memory, not {_SPELLED[kind]} shared memory",
            )
        return [region]

    def resolve(self, name: str, offset: int, nbytes: int) -> Region:
        """The region a tensor references, checked as Triton's GetMemoryInfo does and in
        its order: the offset first, then overflow, then the end of the span. ``offset``
        and ``nbytes`` are unsigned (size_t in Triton)."""
        region = self.by_name.get(name)
        if region is None:
            raise ServingError(Code.NOT_FOUND, f"Unable to find shared memory region: '{name}'")
        if offset >= region.byte_size:
            raise invalid_arg(f"Invalid offset for shared memory region: '{name}'")
        if nbytes > SIZE_MAX - offset:
            raise invalid_arg(
                f"Integer overflow detected: byte_size ({nbytes}) + offset ({offset}) "
                f"exceeds maximum value ({SIZE_MAX}) for region '{name}'"
            )
        if offset + nbytes > region.byte_size:
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
                self._remove(region)
                freed.append(reg_id)
        return freed
