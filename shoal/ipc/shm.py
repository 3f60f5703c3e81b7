"""Server-internal POSIX shared memory: slabs, slot allocation, mapping, sweeping.

Ownership: a slab is created, pre-faulted and unlinked by exactly one process (its
owner). Other processes only map it by name, through ``RegionMap``. Names look like
``shoal-<owner pid>-<role>-<64 random bits>`` in /dev/shm with mode 0600: the pid lets
``sweep_stale`` remove what a killed owner left behind, the random part keeps the name
unguessable, and the ``shoal-`` prefix is a namespace clients can never register
(Triton's 2025 RCE chain went through a client registering an internal region).

Slabs are pre-faulted once (first touch of tmpfs pages runs near 1 GB/s, a warm slab
copies at 10+ GB/s) and reused: no segment is ever created per request.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import logging
import mmap
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from shoal.ipc.messages import ClientRegion

log = logging.getLogger(__name__)

SHM_DIR: Final[Path] = Path("/dev/shm")
PREFIX: Final[str] = "shoal-"
_NAME_RE: Final = re.compile(r"^shoal-(\d+)-([a-z]+)-([0-9a-f]{16})$")
# A segment being created: not locked yet, so sweepers go by its age alone (creation
# renames it within microseconds; the pid cannot tell across pid namespaces).
_NEW_STALE_S: Final[float] = 30.0
_NEW_SUFFIX: Final[str] = ".new"
_NEW_RE: Final = re.compile(r"^shoal-(\d+)-([a-z]+)-([0-9a-f]{16})\.new$")
_BROKER_FD_RE: Final = re.compile(r"^/proc/[0-9]+/fd/[0-9]+$")
ALIGN: Final[int] = 64
_GROW_GRANULE: Final[int] = 2 << 20


class ShmFull(OSError):
    """/dev/shm has no room for another slab."""


def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


class ShmSegment:
    """A named segment owned (created, pre-faulted, unlinked) by this process."""

    def __init__(self, size: int, role: str) -> None:
        self.size = size
        self.name = f"{PREFIX}{os.getpid()}-{role}-{secrets.token_hex(8)}"
        path = SHM_DIR / self.name
        # Created under a name sweepers lock-check never, then renamed once locked: a
        # sweeper that looked between the creation and the lock would find the lock
        # free and unlink a live segment (or hold the lock as the owner asks for it).
        pending = SHM_DIR / (self.name + _NEW_SUFFIX)
        fd = os.open(pending, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            # The owner holds an exclusive lock on the segment for as long as it lives;
            # the kernel drops it when the process dies, however it dies. That, not the
            # pid in the name, is what tells a sweeper the segment is stale: it works
            # across pid namespaces sharing /dev/shm, with zombies, and with reused pids.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(pending, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(pending)
            os.close(fd)
            raise
        try:
            os.ftruncate(fd, size)
            try:
                # Reserve the pages now: a full tmpfs then fails here with ENOSPC
                # instead of killing the process with SIGBUS on first touch.
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                raise ShmFull(
                    f"cannot reserve {size} bytes of shared memory in {SHM_DIR}: "
                    f"{exc.strerror} (in a container, raise --shm-size)"
                ) from None
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self._mmap = mmap.mmap(fd, size, flags=flags)
        except BaseException:
            os.unlink(path)
            os.close(fd)
            raise
        self._fd = fd
        self.buf = memoryview(self._mmap)

    def close(self) -> None:
        """Unmap and unlink. Views still exported keep the pages until they die."""
        self.buf.release()
        with contextlib.suppress(BufferError):
            self._mmap.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(SHM_DIR / self.name)
        os.close(self._fd)


@dataclass(slots=True)
class Slot:
    """A span of a slab. ``view`` is valid until the slot is freed."""

    region: str
    offset: int
    nbytes: int
    capacity: int
    view: memoryview


class _FreeList:
    """First-fit free list of one segment, spans kept sorted by offset and coalesced."""

    def __init__(self, size: int) -> None:
        self.starts: list[int] = [0]
        self.ends: list[int] = [size]
        self.size = size
        self.used = 0

    def take(self, n: int) -> int | None:
        for i, (s, e) in enumerate(zip(self.starts, self.ends, strict=True)):
            if e - s >= n:
                if e - s == n:
                    del self.starts[i], self.ends[i]
                else:
                    self.starts[i] = s + n
                self.used += n
                return s
        return None

    def give(self, start: int, n: int) -> None:
        end = start + n
        i = bisect.bisect_left(self.starts, start)
        self.used -= n
        merge_left = i > 0 and self.ends[i - 1] == start
        merge_right = i < len(self.starts) and self.starts[i] == end
        if merge_left and merge_right:
            self.ends[i - 1] = self.ends[i]
            del self.starts[i], self.ends[i]
        elif merge_left:
            self.ends[i - 1] = end
        elif merge_right:
            self.starts[i] = start
        else:
            self.starts.insert(i, start)
            self.ends.insert(i, end)


class SlabPool:
    """Slots in pre-faulted slabs owned by this process. Not thread-safe.

    The first slab (``slab_bytes``) lives as long as the pool. A request that finds no
    room gets a new slab big enough for it; growth slabs are unlinked again as soon as
    they are empty and the pool holds more than ``keep_bytes``.
    """

    def __init__(self, role: str, slab_bytes: int, keep_bytes: int | None = None) -> None:
        self._role = role
        self._slab_bytes = max(_align(slab_bytes), _GROW_GRANULE)
        self._keep = keep_bytes if keep_bytes is not None else 4 * self._slab_bytes
        self._keep_arg = keep_bytes
        self._segments: dict[str, tuple[ShmSegment, _FreeList]] = {}
        self._order: list[str] = []
        self._add(self._slab_bytes)

    @property
    def total_bytes(self) -> int:
        return sum(seg.size for seg, _ in self._segments.values())

    @property
    def used_bytes(self) -> int:
        """The bytes of the slots taken and not yet freed (each rounded up as kept)."""
        return sum(free.used for _, free in self._segments.values())

    def fresh(self) -> SlabPool:
        """A new pool with the same settings (the old one is closed by the caller)."""
        return SlabPool(self._role, self._slab_bytes, self._keep_arg)

    def names(self) -> list[str]:
        return list(self._order)

    def _add(self, size: int) -> str:
        seg = ShmSegment(size, self._role)
        self._segments[seg.name] = (seg, _FreeList(size))
        self._order.append(seg.name)
        log.debug("shm slab %s: %d bytes", seg.name, size)
        return seg.name

    def alloc(self, nbytes: int) -> Slot:
        need = _align(max(nbytes, 1))
        for name in self._order:
            seg, free = self._segments[name]
            off = free.take(need)
            if off is not None:
                return Slot(name, off, nbytes, need, seg.buf[off : off + nbytes])
        size = max(self._slab_bytes, (need + _GROW_GRANULE - 1) // _GROW_GRANULE * _GROW_GRANULE)
        name = self._add(size)
        seg, free = self._segments[name]
        off = free.take(need)
        assert off is not None
        return Slot(name, off, nbytes, need, seg.buf[off : off + nbytes])

    def free(self, slot: Slot) -> None:
        slot.view.release()
        entry = self._segments.get(slot.region)
        if entry is None:
            return
        seg, free = entry
        free.give(slot.offset, slot.capacity)
        if free.used == 0 and slot.region != self._order[0] and self.total_bytes > self._keep:
            del self._segments[slot.region]
            self._order.remove(slot.region)
            seg.close()

    def close(self) -> None:
        for seg, _ in self._segments.values():
            seg.close()
        self._segments.clear()
        self._order.clear()


@dataclass(slots=True)
class _ClientMapping:
    """A worker's mapping of one client registration. The mmap keeps its own duplicate
    of the file's descriptor, so ``mm.size()`` reads the size of that same file (not of
    whatever now has its name): every access checks the file still holds the bytes."""

    key: str
    start: int  # where the registered region starts inside the shm object
    mm: mmap.mmap
    mv: memoryview  # the registered region alone

    def close(self) -> None:
        try:
            self.mv.release()
        finally:
            with contextlib.suppress(BufferError):
                self.mm.close()


def _open_registered(key: str, path: str) -> int:
    """A descriptor of the shm object a client registered under ``key``.

    ``path`` is the broker's descriptor of it (``/proc/<pid>/fd/<n>``, a magic link that
    reaches the registered object even once the key is unlinked or names another file).
    Where this process may not open it (a broker that runs as another user, or is not
    dumpable), or without one, the key is opened by name: the caller checks it is still
    the object registered."""
    flags = os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY
    if _BROKER_FD_RE.match(path):
        try:
            return os.open(path, flags)
        except PermissionError as exc:
            _warn_once(f"cannot open the broker's descriptors ({exc}); opening keys by name")
        except OSError:
            pass  # by name: the caller maps it only if it is still the object registered
    bare = key.lstrip("/")
    if not bare or "/" in bare or bare.startswith(PREFIX):
        raise ValueError("invalid shared memory key")
    return os.open(SHM_DIR / bare, flags | os.O_NOFOLLOW)


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


class RegionMap:
    """Read-write mappings of other processes' slabs, by name, cached. Not thread-safe.

    Only names in shoal's namespace are mapped, and client regions only when the file
    is the very object the broker registered (same device and inode): a message can
    never make a worker map an arbitrary file.
    """

    def __init__(self) -> None:
        self._maps: dict[str, tuple[mmap.mmap, memoryview]] = {}
        self._clients: dict[int, _ClientMapping] = {}

    def view(self, region: str, offset: int, nbytes: int) -> memoryview:
        """A view of ``nbytes`` at ``offset`` of ``region``; raises ValueError if out of range."""
        entry = self._maps.get(region)
        if entry is None:
            entry = self._open(region)
        mm, mv = entry
        if offset < 0 or nbytes < 0 or offset + nbytes > len(mm):
            raise ValueError(f"reference [{offset}, {offset + nbytes}) outside its region")
        return mv[offset : offset + nbytes]

    def _open(self, region: str) -> tuple[mmap.mmap, memoryview]:
        if not _NAME_RE.match(region):
            raise ValueError("not a shoal shared-memory region")
        fd = os.open(SHM_DIR / region, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)
        entry = (mm, memoryview(mm))
        self._maps[region] = entry
        return entry

    def client_view(self, region: ClientRegion, offset: int, nbytes: int) -> memoryview:
        """A view into a client-registered system region (``byte_size`` bytes at
        ``offset`` of its shm object, opened through ``path``, the broker's descriptor of
        it), mapped once per registration. The broker checked the span against the
        registration; here it is checked against the file.

        The client owns the file and may shrink it at any time; touching a mapped page
        past its end kills this process with SIGBUS. So every access first fstat()s the
        file (``mm.size()``) and refuses a span it no longer holds. A client that shrinks the file
        between this check and the access (or while the model reads the view) can still
        fault the worker: Triton maps client regions the same way and has the same
        exposure."""
        reg_id = region.reg_id
        c = self._clients.get(reg_id)
        if c is None:
            c = self._clients[reg_id] = self._open_client(region)
        if offset < 0 or nbytes < 0 or offset + nbytes > len(c.mv):
            raise ValueError(f"reference [{offset}, {offset + nbytes}) outside its region")
        file_size = c.mm.size()
        if c.start + offset + nbytes > file_size:
            raise ValueError(
                f"shared memory region with key '{c.key}' is smaller than its registration: "
                f"the file holds {file_size} bytes, the request needs bytes "
                f"[{c.start + offset}, {c.start + offset + nbytes})"
            )
        return c.mv[offset : offset + nbytes]

    @staticmethod
    def _open_client(region: ClientRegion) -> _ClientMapping:
        key, start, size = region.key, region.offset, region.byte_size
        fd = _open_registered(key, region.path)
        try:
            st = os.fstat(fd)
            # Map only the object registered (its st_dev and st_ino), a regular file, and
            # only while it still holds the whole region (mmap itself would accept a
            # shorter one).
            if (
                (st.st_dev, st.st_ino) != (region.dev, region.ino)
                or not stat.S_ISREG(st.st_mode)
                or st.st_size < start + size
            ):
                raise ValueError(
                    f"shared memory region with key '{key}' no longer matches its registration"
                )
            page = mmap.ALLOCATIONGRANULARITY
            base = start - start % page
            mm = mmap.mmap(fd, size + (start - base), flags=mmap.MAP_SHARED, offset=base)
        finally:
            os.close(fd)  # the mmap holds its own duplicate: one descriptor per mapping
        mv = memoryview(mm)[start - base : start - base + size]
        return _ClientMapping(key, start, mm, mv)

    def release_clients(self, reg_ids: list[int]) -> None:
        for reg_id in reg_ids:
            c = self._clients.pop(reg_id, None)
            if c is not None:
                c.close()

    def drop_unlinked(self) -> None:
        """Drop mappings of slabs whose owner unlinked them (their pages can then go)."""
        for name in [n for n in self._maps if not (SHM_DIR / n).exists()]:
            self._drop(name)

    def forget_owner(self, pid: int) -> None:
        """Drop the mappings of slabs owned by ``pid`` (it died: its pages can go)."""
        for name in [n for n in self._maps if n.startswith(f"{PREFIX}{pid}-")]:
            self._drop(name)

    def _drop(self, name: str) -> None:
        mm, mv = self._maps[name]
        try:
            mv.release()
        except BufferError:
            return  # a view of it is still alive: dropped by a later sweep
        del self._maps[name]
        with contextlib.suppress(BufferError):
            mm.close()

    def close(self) -> None:
        for name in list(self._maps):
            self._drop(name)
        self.release_clients(list(self._clients))


def owner_gone(path: Path) -> bool:
    """Whether the process that created ``path`` and held an exclusive flock on it has
    exited (the lock is free); False when it cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def owner_pid(name: str) -> int | None:
    m = _NAME_RE.match(name) or _NEW_RE.match(name)
    return int(m.group(1)) if m else None


def _abandoned(path: Path) -> bool:
    """Whether a segment still being created was left so long ago its creator died."""
    try:
        return time.time() - path.lstat().st_mtime > _NEW_STALE_S
    except FileNotFoundError:
        return False


def sweep_stale(only_pids: set[int] | None = None) -> list[str]:
    """Unlink shoal segments whose owner has exited (among those of ``only_pids``, when
    given). Returns the names removed. Safe at any time: a live owner's slabs stay."""
    removed: list[str] = []
    try:
        entries = list(SHM_DIR.iterdir())
    except FileNotFoundError:
        return removed
    for path in entries:
        pid = owner_pid(path.name)
        if pid is None:
            continue
        if only_pids is not None and pid not in only_pids:
            continue
        # One being created is not locked yet: stale once it is old.
        creating = path.name.endswith(_NEW_SUFFIX)
        if _abandoned(path) if creating else owner_gone(path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path.name)
    return removed
