"""Tensor data between JSON values and wire layout, for the HTTP codec.

Pure functions, no I/O, safe to call from any thread. Wire layout is the one
``shoal.dataplane.types`` documents: row-major little-endian, BOOL one byte, BF16 raw 16-bit
patterns, BYTES as 4-byte little-endian lengths each followed by the bytes. Numeric
conversions go through numpy; only BYTES walks its elements one by one.
"""

from __future__ import annotations

import json
from itertools import chain
from typing import Any, Final

import msgspec
import numpy as np

from shoal.ipc import datatypes
from shoal.ipc.datatypes import DataType
from shoal.ipc.errors import Code, ServingError, invalid_arg, invalid_request

INT64_MAX: Final = 2**63 - 1

# JSON levels around an input's "data" array: document, "inputs" array, input object.
_DATA_NESTING: Final = 3

_SIGNED: Final = frozenset({"INT8", "INT16", "INT32", "INT64"})
_UNSIGNED: Final = frozenset({"UINT8", "UINT16", "UINT32", "UINT64"})
_FLOATS: Final = frozenset({"FP16", "FP32", "FP64", "BF16"})


def flatten(data: list[Any]) -> tuple[list[Any], set[type], int]:
    """Row-major flattening of nested JSON arrays: the leaves, their types and the
    nesting depth (1 for a flat array).

    Rectangular nesting is flattened one level at a time in C; ragged nesting (which
    Triton accepts as long as the element count matches) falls back to recursion, whose
    depth msgspec's decoder has already bounded.
    """
    flat = data
    depth = 1
    types = set(map(type, flat))
    while types == {list}:
        flat = list(chain.from_iterable(flat))
        types = set(map(type, flat))
        depth += 1
    if list in types:
        out: list[Any] = []
        depth += _flatten_ragged(flat, out) - 1
        return out, set(map(type, out)), depth
    return flat, types, depth


def _flatten_ragged(data: list[Any], out: list[Any]) -> int:
    deepest = 1
    for item in data:
        if type(item) is list:
            deepest = max(deepest, 1 + _flatten_ragged(item, out))
        else:
            out.append(item)
    return deepest


def depth_exceeded(max_depth: int) -> ServingError:
    return invalid_arg(f"JSON nesting depth exceeds maximum allowed limit ({max_depth})")


def json_error(key: str, problem: str) -> ServingError:
    """What Triton's JSON layer (TritonJson) answers for a member it cannot read: INTERNAL
    (HTTP 500), in its words, as Triton 2.51 does for every member of the request."""
    return ServingError(Code.INTERNAL, f"Unable to parse '{key}': {problem}")


def _parse_error(what: str) -> ServingError:
    return json_error("data", f"attempt to access JSON non-{what} as {what}")


def tensor_from_json(
    name: str, dt: DataType, data: list[Any], element_count: int, model: str, max_depth: int
) -> memoryview:
    """Wire-layout bytes for an input's JSON ``data`` (nested or flat) of ``dt``.

    ``max_depth`` is the JSON nesting limit for the whole request, which wraps ``data``
    in three levels (document, "inputs" array, input object). Raises ServingError
    when the nesting is too deep, a value has the wrong JSON type or the number of
    elements differs from ``element_count`` (these two INTERNAL, as Triton 2.51).
    """
    flat, types, depth = flatten(data)
    if depth + _DATA_NESTING > max_depth:
        raise depth_exceeded(max_depth)
    if dt.name == "BYTES":
        if types - {str}:
            raise _parse_error("string")
        if len(flat) != element_count:
            raise invalid_arg(
                f"expected {element_count} string elements for inference input '{name}' "
                f"for model '{model}', got {len(flat)}"
            )
        return memoryview(datatypes.serialize_bytes(s.encode() for s in flat))
    if len(flat) != element_count:
        raise json_error(  # Triton's words; the counts in brackets are shoal's
            "data",
            "Shape does not match true shape of 'data' field (unexpected number of elements "
            f"for inference input '{name}' for model '{model}': expected {element_count}, "
            f"got {len(flat)})",
        )
    arr = _numeric_array(dt, flat, types)
    return arr.view(np.uint8).data


def _numeric_array(dt: DataType, flat: list[Any], types: set[type]) -> np.ndarray:
    try:
        if dt.name == "BOOL":
            if types - {bool}:
                raise _parse_error("boolean")
            return np.array(flat, dtype=np.bool_)
        if dt.name in _SIGNED or dt.name in _UNSIGNED:
            signed = dt.name in _SIGNED
            what = "signed-integer" if signed else "unsigned-integer"
            if types - {int}:
                raise _parse_error(what)
            try:
                wide = np.array(flat, dtype=np.int64 if signed else np.uint64)
            except OverflowError:
                raise _parse_error(what) from None
            # Narrowing wraps, as Triton's C casts do.
            assert dt.numpy is not None
            return wide.astype(dt.numpy, copy=False)
        if dt.name in _FLOATS:
            if types - {int, float}:
                raise _parse_error("number")
            wide = np.array(flat, dtype=np.float64)
            with np.errstate(over="ignore"):  # out of range becomes inf, as a C cast does
                if dt.name == "BF16":
                    return float_to_bf16_bits(wide.astype(np.float32))
                assert dt.numpy is not None
                return wide.astype(dt.numpy, copy=False)
    except OverflowError as exc:
        raise invalid_arg(f"Unable to parse 'data': {exc}") from None
    raise invalid_arg(f"invalid datatype {dt.name}")


def float_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) of float32 values, rounding to nearest even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        # Keep NaN a (quiet) NaN rather than letting rounding carry it to infinity.
        rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def bf16_bits_to_float(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def check_bytes_elements(name: str, buf: memoryview, element_count: int, model: str) -> None:
    """Validate that a binary BYTES input holds exactly ``element_count`` elements."""
    try:
        datatypes.check_bytes_layout(buf, element_count, name, model)
    except datatypes.BytesLayoutError as exc:
        if exc.names_request:
            raise invalid_request(exc.message) from None
        raise invalid_arg(exc.message) from None


def tensor_to_json(
    name: str, dt: DataType, count: int, data: memoryview
) -> list[Any] | msgspec.Raw:
    """Flat JSON values for an output's wire-layout bytes.

    BYTES elements are decoded as UTF-8; an element that is not valid UTF-8 is decoded
    with replacement characters, since a JSON string cannot carry raw bytes. Floats that
    are not finite are written as Triton writes them, `Infinity`, `-Infinity` and `NaN`
    (outside strict JSON, but what tritonclient reads back), not as null: the array then
    comes back already encoded.
    """
    if dt.name == "BYTES":
        try:
            items = datatypes.split_bytes(data)
        except ValueError:
            raise _shape_mismatch(name) from None
        if len(items) != count:
            raise _shape_mismatch(name)
        return [_utf8(b) for b in items]
    if len(data) != count * dt.itemsize:
        raise _shape_mismatch(name)
    if dt.name == "BF16":
        arr = bf16_bits_to_float(np.frombuffer(data, dtype="<u2"))
    else:
        assert dt.numpy is not None
        arr = np.frombuffer(data, dtype=dt.numpy)
        if dt.name == "FP16":
            arr = arr.astype(np.float64)
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        return msgspec.Raw(json.dumps(arr.tolist()).encode())
    return arr.tolist()


def _utf8(b: bytes) -> str:
    try:
        return b.decode()
    except UnicodeDecodeError:
        return b.decode(errors="replace")


def _shape_mismatch(name: str) -> ServingError:
    return ServingError(
        Code.INTERNAL, f"output tensor shape does not match size of output for '{name}'"
    )
