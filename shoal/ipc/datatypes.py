"""Triton tensor data types: the one table every process reads.

A datatype has three spellings: the KServe v2 name used on the wire ("INT32"), the
model-config enum name ("TYPE_INT32") and a numpy dtype. BYTES has no fixed element
size: its serialized form is a sequence of 4-byte little-endian lengths, each followed
by that many bytes. BF16 has no numpy dtype; it travels as raw uint16 bits.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import numpy as np

from shoal.ipc import bytes_tensors


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


def datatype(name: str) -> DataType | None:
    """The datatype named `name` in v2 spelling, or None if there is none."""
    return DATATYPES.get(name)


def from_config_name(config_name: str) -> DataType | None:
    """The datatype of a ModelConfig enum name such as "TYPE_FP32"."""
    return BY_CONFIG_NAME.get(config_name)


def element_count(shape: tuple[int, ...] | list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def serialize_bytes(values: Iterable[bytes | str | object]) -> bytes:
    """Length-prefixed serialization of BYTES elements (uint32 LE lengths, row-major);
    ``str`` (and anything else) is encoded as UTF-8 text."""
    return bytes_tensors.pack_values(values).tobytes()


def split_bytes(buf: memoryview | bytes) -> np.ndarray:
    """The elements of a length-prefixed BYTES buffer, as a flat object array of bytes.

    Raises ValueError when a length prefix or an element runs past the end.
    """
    found = bytes_tensors.scan(buf, sys.maxsize)
    if found.end != len(memoryview(buf).cast("B")):
        raise ValueError("element byte size indicator exceeds the end of the buffer")
    return bytes_tensors.unpack(buf, found.lengths)


class BytesLayoutError(ValueError):
    """A BYTES tensor whose length-prefixed elements do not make up its shape, with
    Triton's message. ``names_request``: Triton's core writes the message and puts the
    request's id before it; the backend's "incomplete string data" comes without."""

    def __init__(self, message: str, names_request: bool) -> None:
        super().__init__(message)
        self.message = message
        self.names_request = names_request


def check_bytes_layout(buf: memoryview | bytes, count: int, name: str, model: str) -> np.ndarray:
    """The lengths of the ``count`` elements of a BYTES buffer (for
    bytes_tensors.unpack), or BytesLayoutError.

    In Triton's order and words (checked against Triton 2.51): its core
    (InferenceRequest::ValidateBytesInputs) refuses a length prefix cut short, then a
    surplus at the first extra element, and counts an element whose bytes run past the
    end as one (it leaves that to the backend), so a short count is "expected N string
    elements ..., got K"; only then does the backend refuse the element past the end."""
    what = f"for inference input '{name}' for model '{model}'"
    found = bytes_tensors.scan(buf, count + 1)
    complete = found.lengths.size
    if complete > count or (complete == count and found.cut is not None):
        raise BytesLayoutError(
            f"unexpected number of string elements {count + 1} {what}, expecting {count}",
            names_request=True,
        )
    if found.left and found.cut is None:
        raise BytesLayoutError(
            f"incomplete string length indicator {what}, expecting 4 bytes but only "
            f"{found.left} bytes available. Please make sure the string length indicator "
            "is in one buffer.",
            names_request=True,
        )
    seen = complete + (found.cut is not None)
    if seen != count:
        raise BytesLayoutError(f"expected {count} string elements {what}, got {seen}", True)
    if found.cut is not None:
        raise BytesLayoutError(
            f"incomplete string data for inference input '{name}', expecting string of "
            f"length {found.cut} but only {found.left} bytes available",
            names_request=False,
        )
    return found.lengths
