"""How a batch of requests becomes the model's inputs, and its outputs become answers.

The pure core of a worker's execution, following Triton's backends (backend_input_collector,
backend_output_responder and the ONNX Runtime backend's SetInputTensors):

* An input with ``allow_ragged_batch`` goes to the model as ONE 1-D tensor: the requests'
  elements, flattened and concatenated in request order, whatever the number of requests
  (one included) and whatever max_batch_size. Other inputs are concatenated along the batch
  dimension (a batch of one request is passed as it came, no copy).
* Every ``batch_input`` becomes one more model input per target name, computed from the
  shapes the requests gave its source input (see `batch_input_value`).
* Outputs are split among the requests along the batch dimension, except the targets of a
  ``batch_output`` (BATCH_SCATTER_WITH_INPUT_SHAPE): their elements are read in request order,
  each request's part shaped after its own source input.

`BatchAssembler` holds no state beyond the config it was built from; no I/O, no threads.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, cast, get_args

import numpy as np

from shoal.configs.model_spec import ModelSpec
from shoal.ipc.errors import Code, ServingError

BatchInputKind = Literal[
    "BATCH_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
    "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
    "BATCH_ITEM_SHAPE",
    "BATCH_ITEM_SHAPE_FLATTEN",
]
BATCH_INPUT_KINDS: Final[tuple[BatchInputKind, ...]] = get_args(BatchInputKind)
# The only data types Triton allows a batch input (shoal.configs.validation checks it at load).
_BATCH_INPUT_DTYPES: Final[dict[str, np.dtype]] = {
    "INT32": np.dtype("<i4"),
    "FP32": np.dtype("<f4"),
}
_WILDCARD = -1

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BatchInputSpec:
    """One ``batch_input`` of the config: what to compute, from which input, fed as what."""

    kind: BatchInputKind
    targets: tuple[str, ...]
    dtype: np.dtype
    source: str


@dataclass(frozen=True, slots=True)
class ScatterSpec:
    """One ``batch_output`` target: each request's part has ``shape`` (with the batch
    dimension when batching), its -1 dims taken from the request's ``source`` input."""

    source: str
    shape: tuple[int, ...]


def batch_input_value(kind: BatchInputKind, dtype: np.dtype, shapes: Sequence[Shape]) -> Any:
    """The tensor Triton feeds for a batch input, from its source input's shape in each
    request of the batch (request order; full shapes, batch dimension included).

    ELEMENT_COUNT: [n] each request's element count. ACCUMULATED_ELEMENT_COUNT: [n] their
    running sum (where each request ends in the ragged input). ..._WITH_ZERO: [n + 1] the
    same after a leading 0. MAX_ELEMENT_COUNT_AS_SHAPE: [max count]; only the shape says
    something (Triton leaves the contents unset: here zeros). ITEM_SHAPE: [batch items,
    rank - 1], each request's shape without its batch dimension once per batch item (the
    first dim is taken as the batch dimension, as in Triton, even when the model does not
    batch). ITEM_SHAPE_FLATTEN: the same values, 1-D.
    """
    counts = [math.prod(s) for s in shapes]
    if kind == "BATCH_ELEMENT_COUNT":
        return np.array(counts, dtype=dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
        return np.array(list(itertools.accumulate(counts)), dtype=dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
        return np.array([0, *itertools.accumulate(counts)], dtype=dtype)
    if kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":
        return np.zeros(max(counts, default=0), dtype=dtype)
    width = max(len(shapes[-1]) - 1, 0) if shapes else 0
    rows = [list(s[1:]) for s in shapes for _ in range(s[0] if s else 1)]
    items = np.array(rows, dtype=dtype).reshape(len(rows), width)
    return items if kind == "BATCH_ITEM_SHAPE" else items.reshape(-1)


class BatchAssembler:
    """Gathers a batch's inputs for the model and splits its outputs among the requests,
    as the model's config asks (ragged inputs, batch inputs, batch outputs)."""

    def __init__(
        self,
        *,
        ragged: frozenset[str] = frozenset(),
        batch_inputs: tuple[BatchInputSpec, ...] = (),
        scatter: dict[str, ScatterSpec] | None = None,
    ) -> None:
        self.ragged = ragged
        self.batch_inputs = batch_inputs
        self.scatter_specs = scatter or {}

    @classmethod
    def from_config(cls, spec: ModelSpec) -> BatchAssembler:
        """Raises ValueError for a batch input kind or data type Triton does not know (the
        config was validated before: shoal.configs.validation)."""
        batch_inputs = []
        for bi in spec.batch_inputs:
            kind = bi.kind
            dtype = _BATCH_INPUT_DTYPES.get(bi.datatype)
            if kind not in BATCH_INPUT_KINDS or dtype is None or len(bi.source_inputs) != 1:
                raise ValueError(f"unsupported batch input '{kind}'")
            batch_inputs.append(
                BatchInputSpec(
                    cast(BatchInputKind, kind), bi.target_names, dtype, bi.source_inputs[0]
                )
            )
        outputs = {o.name: o for o in spec.outputs}
        scatter = {}
        for bo in spec.batch_outputs:
            for target in bo.target_names:
                out = outputs[target]
                dims = list(out.reshape) if out.reshape is not None else list(out.dims)
                batch = [_WILDCARD] if spec.max_batch_size > 0 else []
                scatter[target] = ScatterSpec(bo.source_inputs[0], (*batch, *dims))
        return cls(
            ragged=frozenset(i.name for i in spec.inputs if i.allow_ragged_batch),
            batch_inputs=tuple(batch_inputs),
            scatter=scatter,
        )

    def gather(self, feeds: list[dict[str, Any]]) -> dict[str, Any]:
        """The model's inputs for a batch of requests' ``feeds`` (name -> array, numpy or
        device arrays). One copy per input when there are several requests, none for an
        unchanged input of a lone request."""
        if len(feeds) == 1 and not self.ragged and not self.batch_inputs:
            return feeds[0]
        batch: dict[str, Any] = {}
        for name in feeds[0]:
            parts = [f[name] for f in feeds]
            if name in self.ragged:
                parts = [p.reshape(-1) for p in parts]
            batch[name] = parts[0] if len(parts) == 1 else concat(parts)
        for bi in self.batch_inputs:
            value = batch_input_value(bi.kind, bi.dtype, _source_shapes(bi.source, feeds))
            for target in bi.targets:
                batch[target] = value
        return batch

    def scatter(
        self,
        names: list[str],
        arrays: list[Any],
        sizes: list[int],
        feeds: list[dict[str, Any]],
    ) -> list[dict[str, Any]]:
        """Each request's part of the outputs ``names`` -> ``arrays`` (views): ``sizes``
        samples each along the batch dimension, or, for a batch output, its elements in
        request order shaped after the request's source input in ``feeds``. Raises
        ServingError (INTERNAL) when an output cannot be split so."""
        per_request: list[dict[str, Any]] = [{} for _ in sizes]
        for name, arr in zip(names, arrays, strict=True):
            spec = self.scatter_specs.get(name)
            if spec is not None:
                parts = _split_by_input_shape(name, arr, spec, feeds)
            elif len(sizes) == 1:
                parts = [arr]
            else:
                parts = _split_by_batch(name, arr, sizes)
            for request, part in zip(per_request, parts, strict=True):
                request[name] = part
        return per_request


def _source_shapes(source: str, feeds: list[dict[str, Any]]) -> list[Shape]:
    try:
        return [tuple(int(d) for d in f[source].shape) for f in feeds]
    except KeyError:
        raise ServingError(
            Code.INVALID_ARG,
            f"input '{source}' is required: a batch input of the model is computed from it",
        ) from None


def _split_by_batch(name: str, arr: Any, sizes: list[int]) -> list[Any]:
    bounds = [0, *itertools.accumulate(sizes)]  # a short list: numpy would cost more
    if not arr.shape or arr.shape[0] != bounds[-1]:
        raise ServingError(
            Code.INTERNAL,
            f"output '{name}' has shape {list(arr.shape)}, but the batch holds "
            f"{bounds[-1]} samples: it cannot be split among the requests",
        )
    return [arr[bounds[i] : bounds[i + 1]] for i in range(len(sizes))]


def _split_by_input_shape(
    name: str, arr: Any, spec: ScatterSpec, feeds: list[dict[str, Any]]
) -> list[Any]:
    """Triton's BATCH_SCATTER_WITH_INPUT_SHAPE: a -1 in the output's shape is the source
    input's dim at the same index, for each request."""
    flat = arr.reshape(-1)
    parts, at = [], 0
    for shape in _source_shapes(spec.source, feeds):
        want = [
            shape[i] if d == _WILDCARD and i < len(shape) else d for i, d in enumerate(spec.shape)
        ]
        count = math.prod(want)
        if _WILDCARD in want or at + count > flat.shape[0]:
            raise ServingError(
                Code.INTERNAL,
                f"output '{name}' has {flat.shape[0]} elements, too few to scatter it among "
                f"the requests with the shapes of input '{spec.source}'",
            )
        parts.append(flat[at : at + count].reshape(want))
        at += count
    return parts


def concat(parts: list[Any]) -> Any:
    """One batch tensor from the requests' tensors, one copy. If any lives on the GPU
    (client CUDA shared memory) the batch is built there, and complete before use."""
    if any(hasattr(p, "__cuda_array_interface__") for p in parts):
        import cupy

        # memcpys along the first axis (no cupy kernel: no NVRTC compile on this path)
        parts = [cupy.ascontiguousarray(cupy.asarray(p)) for p in parts]
        shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
        batch = cupy.empty(shape, dtype=parts[0].dtype)
        at = 0
        for p in parts:
            if p.nbytes:
                (batch.data + at).copy_from_device(p.data, p.nbytes)
            at += p.nbytes
        cupy.cuda.runtime.deviceSynchronize()  # complete before ONNX Runtime's stream reads it
        return batch
    return np.concatenate(parts)
