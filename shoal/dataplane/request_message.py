"""A client's request as the message the broker gets, and an answer's outputs as the client's
tensors (pure: no sockets; the shared-memory slots come from the caller's ``alloc``).

``request_message`` checks what Triton checks while it parses a request (client shared
memory allowed, byte sizes), places each input inline (small), where an earlier step's
answer left it (an ensemble's), in a slot of this process's slab, or as a reference into
the client's region, and reserves a slot for each output of known size above the inline
limit. The request parameters Triton reads itself become the message's fields; a Python
model gets the rest. ``outputs`` reads an answer back: views of the slots it wrote.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from shoal.configs.traffic import ROUTE_KEY
from shoal.dataplane import client_shm_refs
from shoal.dataplane.model_handle import ModelHandle, check_byte_size
from shoal.dataplane.types import ClientRequest, OutputTensor
from shoal.ipc import messages as m
from shoal.ipc.errors import Code, ServingError, invalid_arg
from shoal.ipc.shm import Slot

_INT64_MAX: Final = 2**63 - 1

#: Request parameters Triton reads itself: a Python model's request.parameters() has the rest.
READ_BY_TRITON: Final = frozenset(
    ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers",
     "binary_data_output")
)  # fmt: skip


def parse_version(version: str) -> int:
    """A request's version string as an int64 (-1 for ""). ASCII digits only: Python's
    isdigit also takes "²" and other scripts' digits, and int() of thousands of digits
    raises; Triton refuses them all with the same message."""
    if version == "":
        return -1
    if version.startswith("-") and version[1:].isascii() and version[1:].isdigit():
        raise invalid_arg(
            f"invalid model version specified '{version}' , version should be an integral value > 0"
        )
    if (
        not (version.isascii() and version.isdigit())
        or len(version) > 19
        or int(version) > _INT64_MAX
    ):
        raise invalid_arg(
            f"failed to get model version from specified version string '{version}' "
            "(details: stol), version should be an integral value > 0"
        )
    return int(version)


def uint_param(req: ClientRequest, key: str) -> int:
    """A parameter Triton keeps in a uint64 (priority, timeout); 0 when not given."""
    value = req.parameters.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**64:
        raise invalid_arg(f"parameter '{key}' must be a 64-bit integer, got {value!r}")
    # Triton stores a gRPC int64_param in a uint64: a negative priority becomes a level
    # that does not exist (the default one), a negative timeout one too long to matter.
    return value % 2**64


def sequence_id(req: ClientRequest) -> int | str:
    """The request's correlation ID (0 or "": none), a uint64 or a string, as Triton
    keeps it (a negative gRPC int64_param is stored in a uint64)."""
    value = req.parameters.get("sequence_id", 0)
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**64:
        raise invalid_arg(
            f"parameter 'sequence_id' must be a 64-bit integer or a string, got {value!r}"
        )
    return value % 2**64


def request_message(
    req: ClientRequest,
    model: ModelHandle,
    batch: int,
    slots: list[Slot],
    alloc: Callable[[int], Slot],
    next_id: Callable[[], int],
    allow_client_shm: bool,
) -> m.InferRequest:
    """``req`` for ``model`` (checked: ``batch`` is its batch size) as the broker's
    message, numbered by ``next_id``. The slots ``alloc`` gives go to ``slots``, for the
    caller to free, even when this raises (ServingError: the request is refused)."""
    if not allow_client_shm and any(t.data is None for t in req.inputs):
        raise client_shm_refs.disabled()
    for t in req.inputs[::-1]:  # Triton checks sizes walking its inputs newest first
        if t.data is not None:
            check_byte_size(t, model.name)
    refs = _input_refs(req, model, batch, slots, alloc)
    specs = _output_specs(req, model, batch, slots, alloc, allow_client_shm)
    msg = m.InferRequest(
        req_id=next_id(),
        model=model.name,
        # naming none under a traffic policy: the broker picks (shoal/broker/traffic.py)
        version=-1 if not req.version and model.traffic.active else model.version,
        inputs=refs,
        outputs=specs,
        batch_size=batch,
    )
    params = req.parameters
    if params:  # (most requests carry none: nothing to look up)
        msg.priority = uint_param(req, "priority")
        msg.timeout_us = uint_param(req, "timeout")
        msg.sequence_id = sequence_id(req)
        msg.sequence_start = params.get("sequence_start") is True
        msg.sequence_end = params.get("sequence_end") is True
        if (key := params.get(ROUTE_KEY)) is not None and model.traffic.active:
            msg.route_key = str(key)
    if model.is_python:
        msg.request_id = req.id
        msg.parameters = {
            k: v
            for k, v in req.parameters.items()
            if k not in READ_BY_TRITON and not k.startswith("triton_")
        }
    return msg


def _input_refs(
    req: ClientRequest,
    model: ModelHandle,
    batch: int,
    slots: list[Slot],
    alloc: Callable[[int], Slot],
) -> list[m.TensorRef]:
    refs: list[m.TensorRef] = []
    for t in req.inputs:
        shape = model.model_shape(t, batch)
        if t.data is None:
            refs.append(client_shm_refs.input_ref(t, shape, model.name))
            continue
        n = len(t.data)
        if t.location is not None:  # an earlier step's output, where its answer left it
            region, offset = t.location
            refs.append(m.TensorRef(t.name, t.datatype, shape, n, region, offset))
            continue
        if n <= m.INLINE_MAX_BYTES:
            refs.append(m.TensorRef(t.name, t.datatype, shape, n, data=bytes(t.data)))
            continue
        slot = alloc(n)
        slots.append(slot)
        slot.view[:] = t.data
        refs.append(m.TensorRef(t.name, t.datatype, shape, n, slot.region, slot.offset))
    return refs


def _output_specs(
    req: ClientRequest,
    model: ModelHandle,
    batch: int,
    slots: list[Slot],
    alloc: Callable[[int], Slot],
    allow_client_shm: bool,
) -> list[m.OutputSpec]:
    in_client_shm: dict[str, m.OutputSpec] = {}
    classification: dict[str, int] = {}  # top K asked of an output (K > 0)
    for o in req.outputs:
        if type(k := o.parameters.get("classification", 0)) is int and k > 0:
            classification[o.name] = k
        spec = client_shm_refs.output_spec(o)
        if spec is not None:
            if not allow_client_shm:
                raise client_shm_refs.disabled()
            in_client_shm[o.name] = spec
    specs: list[m.OutputSpec] = []
    for name in [o.name for o in req.outputs] or list(model.outputs):
        if name in in_client_shm:
            specs.append(in_client_shm[name])
            continue
        if classes := classification.get(name, 0):  # a few strings: inline
            specs.append(m.OutputSpec(name, classification=classes))
            continue
        # (a decoupled model's answers carry their outputs: it may send many)
        size = None if model.decoupled else model.output_nbytes(name, batch)
        if size is not None and size > m.INLINE_MAX_BYTES:
            slot = alloc(size)
            slots.append(slot)
            specs.append(m.OutputSpec(name, slot.region, slot.offset, size))
        else:
            specs.append(m.OutputSpec(name))
    return specs


def outputs(resp: m.InferResponse, slots: list[Slot]) -> list[OutputTensor]:
    """The answer's outputs: inline bytes, views of the slots it wrote (``slots``: the
    request's), or no data for those written into the client's region."""
    by_place = {(s.region, s.offset): s for s in slots}
    out: list[OutputTensor] = []
    for ref in resp.outputs:
        data: memoryview | None
        location = None
        if ref.data is not None:
            data = memoryview(ref.data)
        elif ref.region.startswith(m.CLIENT_REGION):
            data = None  # written into the client's region: the response carries no data
        else:
            slot = by_place.get((ref.region, ref.offset))
            if slot is None or ref.nbytes > slot.capacity:
                raise ServingError(Code.INTERNAL, f"output '{ref.name}' came back misplaced")
            data = slot.view[: ref.nbytes]
            location = (ref.region, ref.offset)
        out.append(OutputTensor(ref.name, ref.datatype, list(ref.shape), data, {}, location))
    return out
