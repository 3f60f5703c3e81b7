"""BYTES tensors in their wire layout, at a cost proportional to their bytes.

Each element is a 4-byte little-endian length followed by that many bytes, row-major,
with no padding. A tensor can hold millions of one-byte elements (Triton's QA sends
10 Mi of them), so nothing here takes a Python step per element where numpy can take
the whole tensor at once:

- ``pack`` joins the elements once and places their length prefixes with numpy;
- ``scan`` finds the elements' lengths: the layout can only be read in order (each
  length says where the next one is), so it walks it, but a run of equal lengths (the
  common case: fixed-size ids, one-character strings) is checked and taken at once with
  numpy, and only a change of length costs a Python step;
- ``unpack`` makes the ``bytes`` objects of all elements of one length with one numpy
  gather, one length at a time.

Pure functions over buffers; safe from any thread.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.lib.stride_tricks import as_strided, sliding_window_view

_U32: Final = struct.Struct("<I")
#: Equal lengths in a row after which the walk tries to take a run with numpy; doubled
#: (up to _RUN_AFTER_MAX) each time the run it finds is short, so lengths that change
#: often cost about what a plain walk costs.
_RUN_AFTER: Final = 4
_RUN_AFTER_MAX: Final = 64
#: Elements checked in a run's first numpy step; doubled at each step after.
_RUN_FIRST: Final = 16


@dataclass(frozen=True, slots=True)
class Scan:
    """What a walk over a BYTES buffer found: the lengths of the complete elements, in
    order; where the last one ends; and, when the buffer goes on past it, either the
    declared length of an element cut short (``cut``, with ``left`` bytes after its
    prefix) or a length prefix cut short (``cut`` None, ``left`` bytes of it)."""

    lengths: np.ndarray  # int64, one per complete element
    end: int
    cut: int | None
    left: int


def pack(items: Sequence[bytes] | np.ndarray) -> np.ndarray:
    """The wire layout (a uint8 array) of ``items``, each a ``bytes`` (a list, or a flat
    object array)."""
    n = len(items)
    lengths = np.fromiter(map(len, items), dtype=np.int64, count=n)
    if n == 0:
        return np.empty(0, dtype=np.uint8)
    prefixes = lengths.astype("<u4").view(np.uint8).reshape(n, 4)
    size = int(lengths[0])
    if lengths.min() == lengths.max():  # all one length: one fixed-width copy, no join
        out = np.empty(n * (4 + size), dtype=np.uint8)
        records = out.reshape(n, 4 + size)
        records[:, :4] = prefixes
        if size:  # (a bytes of exactly ``size`` fills its S record, trailing NULs too)
            records[:, 4:] = np.asarray(items, dtype=f"S{size}").view(np.uint8).reshape(n, size)
        return out
    blob = np.frombuffer(b"".join(items), dtype=np.uint8)
    out = np.empty(4 * n + blob.size, dtype=np.uint8)
    at = np.cumsum(lengths + 4) - lengths - 4  # where each prefix starts
    data = np.ones(out.size, dtype=bool)
    for k in range(4):
        out[at + k] = prefixes[:, k]
        data[at + k] = False
    out[data] = blob
    return out


def pack_values(values: Iterable[Any]) -> np.ndarray:
    """``pack`` of any elements: bytes as they are, anything else as its ``str`` in
    UTF-8 (as Triton's Python backend writes them). Only elements that are not bytes
    take a Python step each."""
    items = values.tolist() if isinstance(values, np.ndarray) else list(values)
    if set(map(type, items)) <= {bytes}:
        return pack(values if isinstance(values, np.ndarray) and values.dtype == object else items)
    return pack([v if isinstance(v, bytes) else str(v).encode() for v in items])


def scan(buf: memoryview | bytes, limit: int) -> Scan:
    """Walk the length prefixes of ``buf`` (``limit`` complete elements at most)."""
    mv = memoryview(buf).cast("B")
    u8 = np.frombuffer(mv, dtype=np.uint8)
    sizes: list[int] = []  # the walk's runs: ``counts[i]`` elements of ``sizes[i]`` bytes
    counts: list[int] = []
    pos, end, found = 0, len(mv), 0
    last, same, run_after = -1, 0, _RUN_AFTER
    unpack = _U32.unpack_from
    while pos < end and found < limit:
        if end - pos < 4:
            return _scan(sizes, counts, pos, None, end - pos)
        (size,) = unpack(mv, pos)
        if size > end - pos - 4:
            return _scan(sizes, counts, pos, size, end - pos - 4)
        same = same + 1 if size == last else 0
        last = size
        taken = 1
        if same >= run_after:
            taken = _run(u8, pos, size, limit - found)
            run_after = _RUN_AFTER if taken >= _RUN_FIRST else min(run_after * 2, _RUN_AFTER_MAX)
            same = 0
        if sizes and sizes[-1] == size:
            counts[-1] += taken
        else:
            sizes.append(size)
            counts.append(taken)
        pos += taken * (4 + size)
        found += taken
    return _scan(sizes, counts, pos, None, 0)


def _scan(sizes: list[int], counts: list[int], end: int, cut: int | None, left: int) -> Scan:
    lengths = np.repeat(np.array(sizes, dtype=np.int64), np.array(counts, dtype=np.int64))
    return Scan(lengths, end, cut, left)


def _run(u8: np.ndarray, pos: int, size: int, most: int) -> int:
    """How many elements of ``size`` bytes follow one another from ``pos`` (whose
    prefix says ``size``), up to ``most``: checked a growing block at a time, so a short
    run costs little and a long one a few numpy steps."""
    stride = 4 + size
    room = min((u8.size - pos) // stride, most)
    taken, block = 0, _RUN_FIRST
    want = _U32.pack(size)
    while taken < room:
        step = min(block, room - taken)
        at = pos + taken * stride
        rows = u8[at : at + step * stride].reshape(step, stride)
        same = rows[:, 0] == want[0]
        for k in (1, 2, 3):  # column by column: no copy of the prefixes
            same &= rows[:, k] == want[k]
        if not same.all():
            return taken + int(np.argmin(same))
        taken += step
        block *= 2
    return taken


def unpack(buf: memoryview | bytes, lengths: np.ndarray) -> np.ndarray:
    """The elements (``bytes``) of the first ``len(lengths)`` elements of ``buf``, whose
    lengths ``scan`` found, as a flat object array."""
    n = lengths.size
    if n == 0:
        return np.empty(0, dtype=object)
    u8 = np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)
    low, high = int(lengths.min()), int(lengths.max())
    if low == high:  # all one length: the records are one strided view, no index needed
        return _records(as_strided(u8[4:], shape=(n, low), strides=(4 + low, 1)))
    out = np.empty(n, dtype=object)
    starts = np.cumsum(lengths + 4) - lengths  # where each element's bytes start
    # One gather per distinct length; a radix sort groups them when lengths fit 16 bits.
    keys = lengths.astype(np.uint16) if high < 1 << 16 else lengths
    order = np.argsort(keys, kind="stable")
    ordered = lengths[order]
    bounds = np.flatnonzero(np.diff(ordered)) + 1
    for group in np.split(order, bounds):
        _gather(out, group, u8, starts[group], int(lengths[group[0]]))
    return out


def _gather(out: np.ndarray, where: Any, u8: np.ndarray, starts: np.ndarray, size: int) -> None:
    """``out[where]`` = the ``size``-byte elements at ``starts``."""
    out[where] = _records(sliding_window_view(u8, size)[starts]) if size else b""


def _records(records: np.ndarray) -> np.ndarray:
    """Each row of ``records`` as bytes, in an object array: one fixed-width copy, read
    back through a void dtype (which keeps trailing NULs; ``S`` would strip them)."""
    n, size = records.shape
    if size == 0:
        return np.full(n, b"", dtype=object)
    return np.ascontiguousarray(records).view(f"V{size}").ravel().astype(object)
