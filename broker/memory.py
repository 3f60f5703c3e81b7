"""The memory an instance holds of its own, as the broker's limit on it reads it.

An instance's own memory is its anonymous resident memory: heap, the model's weights
and arenas, thread stacks. Pages it maps from files (libraries, a model file) or from
shared memory (the frontends' slabs, client regions) are shared with other processes or
belong to them, so they do not count. /proc/<pid>/statm gives both sums in one short
read: resident pages minus the file-backed and shared ones.
"""

from __future__ import annotations

import os
from typing import Final

#: How often the broker reads the memory of instances that have a limit.
CHECK_EVERY_S: Final = 0.5
_PAGE: Final = os.sysconf("SC_PAGE_SIZE")
MIB: Final = 1 << 20


def private_memory(pid: int) -> int | None:
    """Bytes of anonymous memory resident in process ``pid``; None if it is gone."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            fields = f.read().split()
    except OSError:
        return None
    return (int(fields[1]) - int(fields[2])) * _PAGE
