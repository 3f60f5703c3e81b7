"""Turning TensorRefs into numpy arrays and numpy results back into TensorRefs.

Inputs are zero-copy views over the frontend's shared memory (or over the message,
for inlined tensors). Outputs are written once, straight into the slot the frontend
reserved; they travel inline only when they are small or have no slot that fits.
"""

from __future__ import annotations

import numpy as np

from ipc import datatypes
from ipc.messages import CLIENT_REGION, INLINE_MAX_BYTES, ClientRegion, OutputSpec, TensorRef
from ipc.shm import RegionMap


class OutputTooLarge(ValueError):
    """An output does not fit the client region the request named for it."""


def tensor_view(
    region: str, offset: int, nbytes: int, regions: RegionMap, clients: dict[int, ClientRegion]
) -> memoryview:
    """The bytes a reference points at: a frontend slab or a client-registered region."""
    if region.startswith(CLIENT_REGION):
        c = clients.get(int(region[len(CLIENT_REGION) :]))
        if c is None:
            raise ValueError("reference to a client region the request does not hold")
        if c.kind != "system":
            raise ValueError("CUDA shared memory needs a KIND_GPU instance")
        return regions.client_view(c.reg_id, c.key, c.offset, c.byte_size, offset, nbytes)
    return regions.view(region, offset, nbytes)


def input_array(ref: TensorRef, regions: RegionMap, clients: dict[int, ClientRegion]) -> np.ndarray:
    """The tensor as numpy: a view for fixed-size types, an object array for BYTES. No
    byte is copied, whether it lives in the frontend's slab or in a client's region."""
    dt = datatypes.datatype(ref.datatype)
    if dt is None:
        raise ValueError(f"unknown datatype {ref.datatype}")
    if ref.data is not None:
        buf: memoryview | bytes = ref.data
    else:
        buf = tensor_view(ref.region, ref.offset, ref.nbytes, regions, clients)
    count = datatypes.element_count(ref.shape)
    if dt.numpy is None:
        items = datatypes.deserialize_bytes(buf, count)
        arr = np.empty(count, dtype=object)
        arr[:] = items
        return arr.reshape(ref.shape)
    if len(buf) != count * dt.itemsize:
        raise ValueError(
            f"input '{ref.name}' holds {len(buf)} bytes, expected {count * dt.itemsize}"
        )
    return np.frombuffer(buf, dtype=dt.numpy, count=count).reshape(ref.shape)


def _wire_bytes(arr: np.ndarray, datatype: str) -> memoryview:
    dt = datatypes.datatype(datatype)
    if dt is None or dt.numpy is None:
        flat = arr.reshape(-1)
        encoded = np.empty(flat.shape, dtype=object)
        encoded[:] = [v if isinstance(v, bytes) else str(v).encode() for v in flat]
        return memoryview(datatypes.serialize_bytes(encoded))
    if arr.dtype != dt.numpy:
        arr = arr.astype(dt.numpy)
    return np.ascontiguousarray(arr).data.cast("B")


def output_ref(
    name: str,
    datatype: str,
    arr: np.ndarray,
    spec: OutputSpec | None,
    regions: RegionMap,
    clients: dict[int, ClientRegion],
) -> TensorRef:
    """Write one output where the frontend asked (a client's region, a slot of its slab),
    or inline it."""
    shape = list(arr.shape)
    data = _wire_bytes(arr, datatype)
    n = len(data)
    if spec is not None and spec.region.startswith(CLIENT_REGION):
        if n > spec.nbytes:
            raise OutputTooLarge(
                f"shared memory size specified with the request for output '{name}' "
                f"({spec.nbytes} bytes) should be at least {n} bytes to hold the results"
            )
        tensor_view(spec.region, spec.offset, n, regions, clients)[:] = data
        return TensorRef(name, datatype, shape, n, spec.region, spec.offset)
    if spec is not None and spec.region and n <= spec.nbytes and n > INLINE_MAX_BYTES:
        dest = regions.view(spec.region, spec.offset, n)
        dest[:] = data
        return TensorRef(name, datatype, shape, n, spec.region, spec.offset)
    return TensorRef(name, datatype, shape, n, data=bytes(data))
