"""Triton tensor data types: the one table every process reads.

A datatype has three spellings: the KServe v2 name used on the wire ("INT32"), the
model-config enum name ("TYPE_INT32") and a numpy dtype. BYTES has no fixed element
size: its serialized form is a sequence of 4-byte little-endian lengths, each followed
by that many bytes. BF16 has no numpy dtype; it travels as raw uint16 bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np


@dataclass(frozen=True, slots=True)
class DataType:
    name: str  # v2 wire name
    config_name: str  # ModelConfig DataType enum name
    numpy: np.dtype | None  # None for BYTES (object arrays)
    itemsize: int  # 0 for BYTES


def _dt(name: str, config: str, np_name: str | None, size: int) -> DataType:
    return DataType(name, config, np.dtype(np_name) if np_name else None, size)


DATATYPES: Final[dict[str, DataType]] = {
    d.name: d
    for d in (
        _dt("BOOL", "TYPE_BOOL", "bool", 1),
        _dt("UINT8", "TYPE_UINT8", "<u1", 1),
        _dt("UINT16", "TYPE_UINT16", "<u2", 2),
        _dt("UINT32", "TYPE_UINT32", "<u4", 4),
        _dt("UINT64", "TYPE_UINT64", "<u8", 8),
        _dt("INT8", "TYPE_INT8", "<i1", 1),
        _dt("INT16", "TYPE_INT16", "<i2", 2),
        _dt("INT32", "TYPE_INT32", "<i4", 4),
        _dt("INT64", "TYPE_INT64", "<i8", 8),
        _dt("FP16", "TYPE_FP16", "<f2", 2),
        _dt("FP32", "TYPE_FP32", "<f4", 4),
        _dt("FP64", "TYPE_FP64", "<f8", 8),
        _dt("BF16", "TYPE_BF16", "<u2", 2),
        _dt("BYTES", "TYPE_STRING", None, 0),
    )
}

BY_CONFIG_NAME: Final[dict[str, DataType]] = {d.config_name: d for d in DATATYPES.values()}

_BY_NUMPY: Final[dict[np.dtype, str]] = {
    d.numpy: d.name for d in DATATYPES.values() if d.numpy is not None and d.name != "BF16"
}


def datatype(name: str) -> DataType | None:
    """The datatype named `name` in v2 spelling, or None if there is none."""
    return DATATYPES.get(name)


def from_config_name(config_name: str) -> DataType | None:
    """The datatype of a ModelConfig enum name such as "TYPE_FP32"."""
    return BY_CONFIG_NAME.get(config_name)


def from_numpy(dtype: np.dtype) -> str:
    """The v2 name for a numpy dtype; object and string dtypes map to BYTES."""
    if dtype.kind in "OSU":
        return "BYTES"
    name = _BY_NUMPY.get(dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype)
    if name is None:
        raise ValueError(f"no Triton datatype for numpy dtype {dtype}")
    return name


def element_count(shape: tuple[int, ...] | list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def serialize_bytes(values: np.ndarray) -> bytes:
    """Length-prefixed serialization of a BYTES tensor (row-major, uint32 LE lengths)."""
    parts: list[bytes] = []
    for item in values.reshape(-1):
        b = item if isinstance(item, bytes) else str(item).encode()
        parts.append(len(b).to_bytes(4, "little"))
        parts.append(b)
    return b"".join(parts)


def deserialize_bytes(buf: memoryview | bytes, count: int | None = None) -> list[bytes]:
    """Split a length-prefixed BYTES buffer into its elements.

    Raises ValueError when the buffer is truncated or, with `count`, when it holds a
    different number of elements.
    """
    mv = memoryview(buf).cast("B")
    out: list[bytes] = []
    pos, end = 0, len(mv)
    while pos < end:
        if end - pos < 4:
            raise ValueError("truncated length prefix in BYTES tensor")
        n = int.from_bytes(mv[pos : pos + 4], "little")
        pos += 4
        if n > end - pos:
            raise ValueError("BYTES element extends past the end of its buffer")
        out.append(bytes(mv[pos : pos + n]))
        pos += n
    if count is not None and len(out) != count:
        raise ValueError(f"expected {count} string elements, got {len(out)}")
    return out
