"""Triton's ``triton_python_backend_utils`` type helpers (re-exported by shoal/workers/pb_utils.py):
the converters between config type names, model_config.proto's numbers and numpy types,
and Triton's serialized BYTES layout."""

from __future__ import annotations

from typing import Any

import numpy as np

#: Triton's module-level name for it, which some models read directly.
TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
# model_config.proto's DataType numbers
_TYPE_NUMBERS = {1: "TYPE_BOOL", 2: "TYPE_UINT8", 3: "TYPE_UINT16", 4: "TYPE_UINT32",
                 5: "TYPE_UINT64", 6: "TYPE_INT8", 7: "TYPE_INT16", 8: "TYPE_INT32",
                 9: "TYPE_INT64", 10: "TYPE_FP16", 11: "TYPE_FP32", 12: "TYPE_FP64",
                 13: "TYPE_STRING"}  # fmt: skip


def as_bytes(v: Any) -> bytes:
    """A BYTES element as bytes (text as UTF-8)."""
    return v if isinstance(v, bytes) else str(v).encode()


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    return TRITON_STRING_TO_NUMPY[_TYPE_NUMBERS[data_type]]


def numpy_to_triton_type(data_type: Any) -> int | None:
    dtype = np.dtype(data_type)
    if dtype.kind in "OSU":
        return 13  # TYPE_STRING
    for number, name in _TYPE_NUMBERS.items():
        if np.dtype(TRITON_STRING_TO_NUMPY[name]) == dtype:
            return number
    return None


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray:
    """Triton's layout of a BYTES tensor (each element: a 4-byte little-endian length,
    then its bytes), as a flat uint8 array."""
    parts = []
    for v in np.asarray(input_tensor, dtype=object).reshape(-1):
        b = as_bytes(v)
        parts += [len(b).to_bytes(4, "little"), b]
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: Any) -> np.ndarray:
    """The elements of a serialized BYTES tensor, as an object array of bytes."""
    raw, items, at = bytes(np.asarray(encoded_tensor, dtype=np.uint8)), [], 0
    while at + 4 <= len(raw):
        n = int.from_bytes(raw[at : at + 4], "little")
        items.append(raw[at + 4 : at + 4 + n])
        at += 4 + n
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out
