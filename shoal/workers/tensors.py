"""Turning TensorRefs into numpy arrays and numpy results back into TensorRefs.

Inputs are zero-copy views over the frontend's shared memory (or over the message,
for inlined tensors). Outputs are written once, straight into the slot the frontend
reserved; they travel inline only when they are small or have no slot that fits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shoal.ipc import bytes_tensors, datatypes
from shoal.ipc.errors import invalid_arg
from shoal.ipc.messages import CLIENT_REGION, INLINE_MAX_BYTES, ClientRegion, OutputSpec, TensorRef
from shoal.ipc.shm import RegionMap
from shoal.workers.cuda_regions import CudaRegions


class OutputTooLarge(ValueError):
    """An output does not fit the client region the request named for it."""


def client_region(region: str, clients: dict[int, ClientRegion]) -> ClientRegion | None:
    """The client registration a reference names, or None for a frontend slab."""
    if not region.startswith(CLIENT_REGION):
        return None
    c = clients.get(int(region[len(CLIENT_REGION) :]))
    if c is None:
        raise ValueError("reference to a client region the request does not hold")
    return c


def tensor_view(
    region: str, offset: int, nbytes: int, regions: RegionMap, clients: dict[int, ClientRegion]
) -> memoryview:
    """The host bytes a reference points at: a frontend slab or a client's system region."""
    c = client_region(region, clients)
    if c is None:
        return regions.view(region, offset, nbytes)
    if c.kind != "system":
        raise ValueError("a CUDA shared memory region holds device memory, not host memory")
    return regions.client_view(c, offset, nbytes)


def input_array(
    ref: TensorRef,
    regions: RegionMap,
    clients: dict[int, ClientRegion],
    cuda: CudaRegions | None = None,
    model: str = "",
) -> Any:
    """The tensor as numpy: a view for fixed-size types, an object array for BYTES. No
    byte is copied, whether it lives in the frontend's slab or in a client's region. A
    tensor in client CUDA memory comes as a device (cupy) array over that memory (on a
    CPU instance, as a host copy of it).

    BYTES from a client's region are checked here, the first time anything reads them:
    datatypes.BytesLayoutError, with Triton's message naming ``model``."""
    dt = datatypes.datatype(ref.datatype)
    if dt is None:
        raise ValueError(f"unknown datatype {ref.datatype}")
    c = client_region(ref.region, clients) if ref.data is None else None
    buf: memoryview | bytes
    if c is not None and c.kind == "cuda":
        if cuda is None:
            raise ValueError(f"input '{ref.name}' cannot be read from CUDA shared memory here")
        if dt.numpy is not None:
            return cuda.array(c, ref.offset, ref.nbytes, dt.numpy, ref.shape)
        buf = cuda.host_bytes(c, ref.offset, ref.nbytes)  # BYTES: no model reads them there
    elif ref.data is not None:
        buf = ref.data
    else:
        buf = tensor_view(ref.region, ref.offset, ref.nbytes, regions, clients)
    count = datatypes.element_count(ref.shape)
    if dt.numpy is None:
        if c is not None:  # a client's bytes: nothing has looked at them yet
            lengths = datatypes.check_bytes_layout(buf, count, ref.name, model)
        else:  # the frontend checked them
            lengths = bytes_tensors.scan(buf, count).lengths
        return bytes_tensors.unpack(buf, lengths).reshape(ref.shape)
    if len(buf) != count * dt.itemsize:
        raise ValueError(
            f"input '{ref.name}' holds {len(buf)} bytes, expected {count * dt.itemsize}"
        )
    return np.frombuffer(buf, dtype=dt.numpy, count=count).reshape(ref.shape)


def on_host(arr: Any) -> np.ndarray:
    """A device (cupy) array's host copy; a host array as it is."""
    if hasattr(arr, "__cuda_array_interface__"):
        return arr.get()  # type: ignore[no-any-return]  # cupy -> numpy
    return arr  # type: ignore[no-any-return]


def _wire_bytes(arr: np.ndarray, datatype: str) -> memoryview:
    arr = on_host(arr)
    dt = datatypes.datatype(datatype)
    if dt is None or dt.numpy is None:
        return bytes_tensors.pack_values(arr.reshape(-1)).data
    if arr.dtype != dt.numpy:
        arr = arr.astype(dt.numpy)
    # Flat first: memoryview.cast refuses a view of several dimensions with a 0 in them.
    return np.ascontiguousarray(arr).reshape(-1).data.cast("B")


def output_ref(
    name: str,
    datatype: str,
    arr: Any,
    spec: OutputSpec | None,
    regions: RegionMap,
    clients: dict[int, ClientRegion],
    cuda: CudaRegions | None = None,
) -> TensorRef:
    """Write one output where the frontend asked (a client's region, a slot of its slab),
    or inline it."""
    shape = list(arr.shape)
    c = client_region(spec.region, clients) if spec is not None else None
    if spec is not None and c is not None and c.kind == "cuda":
        if cuda is None:
            raise ValueError(f"output '{name}' cannot be written to CUDA shared memory here")
        dt = datatypes.datatype(datatype)
        if dt is None or dt.numpy is None:  # BYTES go up serialized, as the client reads them
            arr = np.frombuffer(_wire_bytes(arr, datatype), dtype=np.uint8)
        if int(arr.nbytes) > spec.nbytes:
            raise OutputTooLarge(
                f"shared memory size specified with the request for output '{name}' "
                f"({spec.nbytes} bytes) should be at least {int(arr.nbytes)} bytes to hold "
                "the results"
            )
        n = cuda.write(c, spec.offset, arr)
        return TensorRef(name, datatype, shape, n, spec.region, spec.offset)
    data = _wire_bytes(arr, datatype)
    n = len(data)
    dest = _place(name, spec, n, regions, clients)
    if dest is None or spec is None:
        return TensorRef(name, datatype, shape, n, data=bytes(data))
    if _address(dest) != _address(data):  # else the backend wrote it there already
        dest[:] = data
    return TensorRef(name, datatype, shape, n, spec.region, spec.offset)


def output_destination(
    name: str,
    datatype: str,
    shape: list[int],
    spec: OutputSpec | None,
    regions: RegionMap,
    clients: dict[int, ClientRegion],
) -> np.ndarray | None:
    """A writable array, of ``shape``, over the bytes where output ``name`` will go (the
    client's system region, the frontend's slot), for a backend to write it in place;
    None where it will travel inline, has no numpy type, or would not fit (output_ref
    then reports that)."""
    dt = datatypes.datatype(datatype)
    if spec is None or dt is None or dt.numpy is None or dt.name == "BF16":
        return None
    try:
        c = client_region(spec.region, clients)
        if c is not None and c.kind != "system":
            return None
        dest = _place(name, spec, datatypes.element_count(shape) * dt.itemsize, regions, clients)
    except (ValueError, OSError):  # OutputTooLarge included: output_ref reports them
        return None
    return None if dest is None else np.frombuffer(dest, dtype=dt.numpy).reshape(shape)


def host_span(
    region: str, offset: int, nbytes: int, clients: dict[int, ClientRegion]
) -> tuple[str, int, int]:
    """The bytes a reference covers as (object, start, end): the frontend's slab by name,
    a client's region by its file's device and inode, so that two registrations of one
    object meet, under any name."""
    c = client_region(region, clients)
    if c is None:
        return region, offset, offset + nbytes
    start = c.offset + offset
    return f"inode:{c.dev}:{c.ino}", start, start + nbytes


def _place(
    name: str,
    spec: OutputSpec | None,
    n: int,
    regions: RegionMap,
    clients: dict[int, ClientRegion],
) -> memoryview | None:
    """Where ``n`` bytes of output ``name`` go on the host: the client's region (raises
    OutputTooLarge when they do not fit, as Triton's response allocator does), the slot
    the frontend reserved when they fit it and are too large to inline, else None."""
    if spec is None or not spec.region:
        return None
    if spec.region.startswith(CLIENT_REGION):
        if n > spec.nbytes:
            raise OutputTooLarge(
                f"shared memory size specified with the request for output '{name}' "
                f"({spec.nbytes} bytes) should be at least {n} bytes to hold the results"
            )
        return tensor_view(spec.region, spec.offset, n, regions, clients)
    if n <= spec.nbytes and n > INLINE_MAX_BYTES:
        return regions.view(spec.region, spec.offset, n)
    return None


def _address(buf: memoryview) -> int:
    return int(np.frombuffer(buf, dtype=np.uint8).__array_interface__["data"][0])


def utf8_texts(name: str, arr: Any, framework: str) -> list[str]:
    """A BYTES input's elements (in C order) as text, for a framework whose string tensors
    hold UTF-8 text (NUL bytes pass); an element that is text already passes as it is.
    Raises INVALID_ARG naming the first element that is not UTF-8."""
    out: list[str] = []
    for i, b in enumerate(np.asarray(arr, dtype=object).reshape(-1)):
        if isinstance(b, str):
            out.append(b)
            continue
        try:
            out.append(bytes(b).decode("utf-8"))
        except UnicodeDecodeError:
            raise invalid_arg(
                f"BYTES input '{name}' element {i} is not valid UTF-8, which {framework} "
                "string tensors require"
            ) from None
    return out
