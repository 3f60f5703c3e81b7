"""A request's tensors in client-registered shared memory, turned into references: what a
frontend (or a worker's scripting) sends the broker for them.

The frontend never reads those bytes: it checks the request's own numbers (the byte
size against datatype and shape) and sends a reference ``shm:<region>`` that the broker
checks against the registered region (offset, overflow, end) and a worker maps. The
shared-memory parameters and their errors follow Triton. Each transport's codec has
already checked the parameters' presence and types with its own Triton messages.
"""

from __future__ import annotations

from typing import Final

from shoal.dataplane.types import InputTensor, ParamValue, RequestedOutput
from shoal.ipc import datatypes
from shoal.ipc import messages as m
from shoal.ipc.errors import Code, ServingError, invalid_arg, invalid_request

SHM_DISABLED: Final = (
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
)
_UINT64: Final = 2**64


def disabled() -> ServingError:
    return ServingError(Code.UNSUPPORTED, SHM_DISABLED)


def _params(params: dict[str, ParamValue], what: str) -> tuple[str, int, int] | None:
    """(region, offset, byte size), or None when the tensor names no region.

    Offset and size are unsigned, as Triton's size_t: a gRPC int64 below zero wraps to a
    huge value, so it meets the same bounds checks (and messages) as an HTTP one."""
    region = params.get("shared_memory_region")
    if region is None:
        return None
    offset = params.get("shared_memory_offset", 0)
    size = params.get("shared_memory_byte_size")
    if not isinstance(region, str):
        raise invalid_arg(f"{what}: 'shared_memory_region' must be a string")
    for key, value in (("shared_memory_offset", offset), ("shared_memory_byte_size", size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid_arg(f"{what}: '{key}' must be an integer")
    assert isinstance(offset, int) and isinstance(size, int)
    # The bounds (offset, overflow, end) are checked by the broker against the region,
    # in Triton's order: an offset past the region is reported before an overflow.
    return region, offset % _UINT64, size % _UINT64


def input_ref(t: InputTensor, shape: list[int], model: str) -> m.TensorRef:
    """The reference for an input that lives in a client region (``t.data`` is None)."""
    found = _params(t.parameters, f"input '{t.name}'")
    if found is None:
        raise invalid_arg(f"input '{t.name}' has neither data nor a shared memory region")
    region, offset, size = found
    dt = datatypes.datatype(t.datatype)
    if dt is not None and dt.itemsize:
        expected = datatypes.element_count(t.shape) * dt.itemsize
        if size != expected:
            raise invalid_request(
                f"input byte size mismatch for input '{t.name}' for model '{model}'. "
                f"Expected {expected}, got {size}"
            )
    return m.TensorRef(t.name, t.datatype, shape, size, m.CLIENT_SHM + region, offset)


def references(
    inputs: list[InputTensor], outputs: list[RequestedOutput]
) -> list[tuple[str, int, int]]:
    """(region, offset, byte size) of every tensor the request puts in a client region,
    inputs then outputs, in its order; [] when a reference is malformed (its own
    error stands)."""
    refs = []
    try:
        for t in inputs:
            if (found := _params(t.parameters, f"input '{t.name}'")) is not None:
                refs.append(found)
        for o in outputs:
            if (found := _params(o.parameters, f"output '{o.name}'")) is not None:
                refs.append(found)
    except ServingError:
        return []
    return refs


def output_spec(o: RequestedOutput) -> m.OutputSpec | None:
    """Where an output goes when the request put it in a client region, else None."""
    found = _params(o.parameters, f"output '{o.name}'")
    if found is None:
        return None
    region, offset, size = found
    return m.OutputSpec(o.name, m.CLIENT_SHM + region, offset, size)
