"""Triton's generate extension (provisional in Triton): ``POST /v2/models/{m}[/versions/
{v}]/generate`` and ``/generate_stream``, a flat JSON request and response for text
generation, shaped after Triton 2.51 (checked side by side with the real server).

Request: one JSON object. A key that names an input of the model is that input (a scalar
or a flat list, shaped by the config's dims); any other key is a request parameter (an
int, float, bool or string), and so is each entry of ``"parameters"``, which may name
inputs too. ``"id"`` is the request's id (and a parameter). A key written twice is read
twice, as Triton reads the members one by one: an input named twice is refused.

Response: one JSON object per response of the model, its keys sorted: each output (a
tensor of one element as that element, else a flat list; BYTES as strings), and
``model_name``, ``model_version`` and ``id`` (when the request had one).
"""

from __future__ import annotations

import math
from typing import Any, Final

import msgspec

from shoal.dataplane.json_tensors import tensor_from_json, tensor_to_json
from shoal.dataplane.model_handle import ModelHandle
from shoal.dataplane.types import ClientRequest, InferenceResult, InputTensor, ParamValue
from shoal.frontend.json_members import items
from shoal.ipc import datatypes
from shoal.ipc.errors import Code, ServingError, invalid_arg, named

#: /generate of a model that answered with no response or several (Triton 2.51's words).
ONE_RESPONSE: Final = (
    "generate expects model to produce exactly 1 response, use generate stream for model "
    "that generates various number of responses"
)
_PARAMETERS: Final = "parameters"
_IN_PARAMETERS: Final = f"Converting keyword: '{_PARAMETERS}': "
_MAX_DEPTH: Final = 100


def decode_request(doc: dict[str, Any], model: ModelHandle, version: str) -> ClientRequest:
    """The inference request a generate body asks for (raises ServingError, in Triton's
    words and codes)."""
    req = ClientRequest(model=model.name, version=version)
    inputs: dict[str, InputTensor] = {}
    params: dict[str, ParamValue] = {}

    def take(key: str, value: Any, where: str = "") -> None:
        if key in model.inputs:
            if key in inputs:
                message = named(f"input '{key}' already exists in request", req.id)
                raise invalid_arg(where + message)
            inputs[key] = _input(model, key, value)
        elif isinstance(value, bool | int | float | str):
            params[key] = value
        else:
            raise invalid_arg(
                f"{where}parameter '{key}' has invalid type. It should be either 'int', "
                "'bool', or 'string'."
            )

    for key, value in items(doc):
        if key == _PARAMETERS:
            if not isinstance(value, dict):
                raise ServingError(
                    Code.INTERNAL,
                    f"Expected JSON object for keyword: '{_PARAMETERS}': attempt to access "
                    "JSON non-object as object",
                )
            for k, v in items(value):
                take(k, v, _IN_PARAMETERS)
            continue
        if key == "id" and isinstance(value, str):
            req.id = value
        take(key, value)
    req.inputs = list(inputs.values())
    req.parameters = params
    return req


def _input(model: ModelHandle, name: str, value: Any) -> InputTensor:
    spec = model.inputs[name]
    dt = datatypes.datatype(spec.datatype)
    assert dt is not None  # a config's datatype
    values = value if isinstance(value, list) else [value]
    if dt.name == "BYTES" and not all(isinstance(v, str) for v in values):
        raise ServingError(
            Code.INTERNAL,
            "Unable to parse JSON bytes array: attempt to access JSON non-string as string",
        )
    shape = _shape(spec.dims, model.max_batch_size > 0, len(values))
    if shape is None:
        raise invalid_arg(f"The schema can not convert input '{name}' to tensor with proper shape")
    data = tensor_from_json(name, dt, values, math.prod(shape), model.name, _MAX_DEPTH)
    return InputTensor(name=name, datatype=spec.datatype, shape=shape, data=data)


def _shape(dims: tuple[int, ...], batching: bool, count: int) -> list[int] | None:
    """The config's dims (after a batch dimension of 1, for a model that batches) with
    the first variable one sized to hold ``count`` elements (the others 1); None when
    they cannot hold exactly that many."""
    shape = [1, *dims] if batching else list(dims)
    fixed = math.prod(d for d in shape if d >= 0)
    if -1 not in shape:
        return shape if fixed == count else None
    if fixed == 0:
        return [max(d, 1) for d in shape] if count == 0 else None
    if count % fixed:
        return None
    first = shape.index(-1)
    return [count // fixed if i == first else (1 if d < 0 else d) for i, d in enumerate(shape)]


def encode_response(result: InferenceResult) -> bytes:
    """One response as generate's flat JSON object."""
    out: dict[str, Any] = {"model_name": result.model_name, "model_version": result.model_version}
    if result.id:
        out["id"] = result.id
    for o in result.outputs:
        dt = datatypes.datatype(o.datatype)
        if dt is None or o.data is None:
            continue
        values = tensor_to_json(o.name, dt, datatypes.element_count(o.shape), o.data)
        out[o.name] = values[0] if isinstance(values, list) and len(values) == 1 else values
    return msgspec.json.encode(dict(sorted(out.items())))


def encode_error(message: str) -> bytes:
    return msgspec.json.encode({"error": message})
