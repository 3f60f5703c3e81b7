"""The limit on the memory a model instance holds of its own: reading it, and choosing
the instances over their limit.

An instance's own memory is its anonymous resident memory (``RssAnon`` in
/proc/<pid>/status): heap, the model's weights and arenas, thread stacks. Pages it maps
from files (libraries, a model file) or from shared memory (the frontends' slabs, client
regions) are shared with other processes or belong to them, so they do not count.
Linux has reported RssAnon since 4.5; a kernel that does not (gVisor's procfs, whose
statm also says nothing of shared pages) cannot tell the two apart, and there the limit
is not enforced rather than enforced on the wrong figure (``supported``).

``over_limit`` picks the instances over their limit, with the reader passed in (no /proc
of its own); shoal/broker/endings.py decides what becomes of them.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from typing import Final

from shoal.broker.models import Instance

#: How often the broker reads the memory of instances that have a limit.
CHECK_EVERY_S: Final = 0.5
MIB: Final = 1 << 20
_RSS_ANON: Final = b"RssAnon:"


def rss_anon(status: bytes) -> int | None:
    """Bytes of anonymous resident memory in a /proc/<pid>/status text; None if the
    kernel does not report it."""
    at = status.find(_RSS_ANON)
    if at < 0:
        return None
    fields = status[at + len(_RSS_ANON) : status.find(b"\n", at)].split()
    return int(fields[0]) * 1024 if fields else None  # "<n> kB"


def private_memory(pid: int | str) -> int | None:
    """Bytes of anonymous memory resident in process ``pid``; None if it is gone or the
    kernel does not say."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            return rss_anon(f.read())
    except OSError:
        return None


def supported() -> bool:
    """Whether this kernel reports a process's own memory (this process's, as a probe)."""
    return private_memory("self") is not None


@dataclass(frozen=True)
class OverLimit:
    inst: Instance
    used: int  # bytes
    limit_mb: int

    @property
    def runaway(self) -> bool:
        """Twice its limit: too far to let its batch finish (it is killed at once)."""
        return self.used > 2 * self.limit_mb * MIB

    @property
    def reason(self) -> str:
        return f"it held {self.used // MIB} MiB of memory, over its limit of {self.limit_mb} MiB"


def over_limit(
    instances: Iterable[Instance],
    limit_mb: Callable[[Instance], int],
    read: Callable[[int], int | None],
    stopping: Container[bytes] = (),
) -> list[OverLimit]:
    """The ready instances holding more than their limit (<= 0: none). Only instances
    that have a limit are read; loading ones are skipped (a load may peak, then settle),
    and so are those no longer READY (already ended, say), unless ``stopping`` holds
    them: instances asked to stop, read again in case they run away meanwhile."""
    out: list[OverLimit] = []
    for inst in instances:
        if inst.state != "READY" and inst.ident not in stopping:
            continue
        limit = limit_mb(inst)
        if limit <= 0:
            continue
        used = read(inst.pid)
        if used is not None and used > limit * MIB:
            out.append(OverLimit(inst, used, limit))
    return out
