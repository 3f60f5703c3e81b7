"""Triton's gRPC messages <-> the frontend's transport-agnostic types.

Uses the generated modules Triton publishes in tritonclient's grpc package
(``service_pb2``, ``model_config_pb2``) rather than a hand-copied .proto: they are the
protocol owner's, field numbers and all, so a wire mismatch cannot creep in. Protobuf
types stay inside this module and ``grpc_server``.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from frontend.types import (
    InferenceRequest,
    InferenceResult,
    InputTensor,
    ParamValue,
    RequestedOutput,
)
from ipc import datatypes
from ipc.errors import Code, ServingError, invalid_arg, named

_SHM_REGION: Final = "shared_memory_region"

# datatype -> (InferTensorContents field, numpy dtype the field's values convert through)
_TYPED: Final[dict[str, tuple[str, str]]] = {
    "BOOL": ("bool_contents", "bool"),
    "INT8": ("int_contents", "<i1"),
    "INT16": ("int_contents", "<i2"),
    "INT32": ("int_contents", "<i4"),
    "INT64": ("int64_contents", "<i8"),
    "UINT8": ("uint_contents", "<u1"),
    "UINT16": ("uint_contents", "<u2"),
    "UINT32": ("uint_contents", "<u4"),
    "UINT64": ("uint64_contents", "<u8"),
    "FP32": ("fp32_contents", "<f4"),
    "FP64": ("fp64_contents", "<f8"),
}


def param_value(p: pb.InferParameter) -> ParamValue:
    which = p.WhichOneof("parameter_choice")
    if which is None:
        return ""
    return getattr(p, which)  # type: ignore[no-any-return]


def set_param(p: pb.InferParameter, value: ParamValue) -> None:
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        p.int64_param = value
    elif isinstance(value, float):
        p.double_param = value
    else:
        p.string_param = str(value)


def _params(src: Any) -> dict[str, ParamValue]:
    return {k: param_value(v) for k, v in src.items()}


#: The request parameters Triton reads itself, and the kinds it accepts for each.
_SCHEDULING_PARAMS: Final[dict[str, tuple[tuple[str, ...], str]]] = {
    "priority": (("int64_param", "uint64_param"), "int64_param or uint64_param"),
    "timeout": (("int64_param",), "int64_param"),
}


def _request_params(src: Any) -> dict[str, ParamValue]:
    for key, (kinds, expected) in _SCHEDULING_PARAMS.items():
        if key in src and src[key].WhichOneof("parameter_choice") not in kinds:
            raise invalid_arg(f"invalid value type for '{key}' parameter, expected {expected}.")
    return _params(src)


def _check_shm_params(t: Any) -> bool:
    """Whether tensor ``t`` (an input or a requested output) lives in a client region;
    raises on a malformed shared-memory parameter with Triton's message, in the order of
    its ParseSharedMemoryParams (src/grpc/infer_handler.h)."""
    params = t.parameters
    has_region = _SHM_REGION in params
    if has_region and params[_SHM_REGION].WhichOneof("parameter_choice") != "string_param":
        raise invalid_arg(
            f"invalid value type for '{_SHM_REGION}' parameter for tensor '{t.name}', "
            "expected string_param."
        )
    for key in ("shared_memory_offset", "shared_memory_byte_size"):
        if key not in params:
            continue
        if not has_region:
            raise invalid_arg(
                f"'{key}' can not be specified without '{_SHM_REGION}' parameter for tensor "
                f"'{t.name}'"
            )
        if params[key].WhichOneof("parameter_choice") != "int64_param":
            raise invalid_arg(
                f"invalid value type for '{key}' parameter for tensor '{t.name}', "
                "expected int64_param."
            )
    if has_region and "shared_memory_byte_size" not in params:
        raise invalid_arg(
            f"'shared_memory_byte_size' must be specified along with '{_SHM_REGION}' "
            f"parameter for tensor '{t.name}'"
        )
    return has_region


def decode_infer_request(req: pb.ModelInferRequest) -> InferenceRequest:
    """A ModelInferRequest as an InferenceRequest (tensor data in wire layout)."""
    raw = req.raw_input_contents
    inputs: list[InputTensor] = []
    raw_index = 0
    names: set[str] = set()
    for t in req.inputs:
        if t.name in names:  # Triton's request refuses it, naming itself
            raise invalid_arg(named(f"input '{t.name}' already exists in request", req.id))
        names.add(t.name)
        params = _params(t.parameters)
        if datatypes.datatype(t.datatype) is None:
            raise invalid_arg(f"invalid datatype '{t.datatype}' for input '{t.name}'")
        shape = list(t.shape)
        if any(d < 0 for d in shape):
            raise invalid_arg(f"input '{t.name}' has a negative dimension in its shape {shape}")
        has_contents = t.HasField("contents")
        if _check_shm_params(t):
            if has_contents:
                raise invalid_arg(
                    "unexpected 'content' provided when using shared memory for input tensor "
                    f"'{t.name}' for model '{req.model_name}'"
                )
            inputs.append(InputTensor(t.name, t.datatype, shape, None, params))
            continue
        if raw:
            if has_contents:
                raise invalid_arg(
                    "contents field must not be specified when using raw_input_contents for "
                    f"'{t.name}' for model '{req.model_name}'"
                )
            if raw_index >= len(raw):
                raise invalid_arg(
                    f"expected tensor data for input '{t.name}' for model '{req.model_name}' "
                    "in raw_input_contents"
                )
            data = memoryview(raw[raw_index])
            raw_index += 1
        else:
            data = _typed_contents(t, req.model_name)
        inputs.append(InputTensor(t.name, t.datatype, shape, data, params))
    if raw and raw_index != len(raw):
        raise invalid_arg(
            f"unexpected number of raw_input_contents for model '{req.model_name}': "
            f"{len(raw)} given for {raw_index} input(s)"
        )
    seen: set[str] = set()
    outputs: list[RequestedOutput] = []
    for o in req.outputs:
        if o.name in seen:
            raise invalid_arg(f"output '{o.name}' already exists in request")
        seen.add(o.name)
        _check_shm_params(o)
        params = _params(o.parameters)
        classes = params.get("classification", 0)
        if classes:  # as the HTTP side: no shoal backend produces class labels
            raise ServingError(
                Code.UNSUPPORTED,
                f"classification output is not supported: output '{o.name}' requests "
                f"classification {classes}",
            )
        outputs.append(RequestedOutput(o.name, params))
    return InferenceRequest(
        model=req.model_name,
        version=req.model_version,
        id=req.id,
        parameters=_request_params(req.parameters),
        inputs=inputs,
        outputs=outputs,
    )


def _typed_contents(t: Any, model: str) -> memoryview:
    if t.datatype == "BYTES":
        return memoryview(
            datatypes.serialize_bytes(np.array(list(t.contents.bytes_contents), dtype=object))
        )
    spec = _TYPED.get(t.datatype)
    if spec is None:
        raise invalid_arg(
            f"{t.datatype} input '{t.name}' for model '{model}' can only be sent in "
            "raw_input_contents"
        )
    field, dtype = spec
    values = getattr(t.contents, field)
    try:
        arr = np.array(values, dtype=dtype)
    except OverflowError:
        raise invalid_arg(f"a value of input '{t.name}' does not fit {t.datatype}") from None
    return memoryview(arr.tobytes())


def encode_infer_response(result: InferenceResult) -> pb.ModelInferResponse:
    """Outputs always go back in raw_output_contents, as Triton does."""
    resp = pb.ModelInferResponse(
        model_name=result.model_name, model_version=result.model_version, id=result.id
    )
    for k, v in result.parameters.items():
        set_param(resp.parameters[k], v)
    for out in result.outputs:
        t = resp.outputs.add(name=out.name, datatype=out.datatype, shape=out.shape)
        for k, v in out.parameters.items():
            set_param(t.parameters[k], v)
        # An output written to client shared memory keeps its place with an empty entry,
        # so raw_output_contents stays aligned with outputs (clients index them together).
        resp.raw_output_contents.append(bytes(out.data) if out.data is not None else b"")
    return resp


def model_metadata(meta: dict[str, Any]) -> pb.ModelMetadataResponse:
    def tensors(items: list[dict[str, Any]]) -> list[pb.ModelMetadataResponse.TensorMetadata]:
        return [
            pb.ModelMetadataResponse.TensorMetadata(
                name=i["name"], datatype=i["datatype"], shape=i["shape"]
            )
            for i in items
        ]

    return pb.ModelMetadataResponse(
        name=meta["name"],
        versions=meta["versions"],
        platform=meta["platform"],
        inputs=tensors(meta["inputs"]),
        outputs=tensors(meta["outputs"]),
    )


def model_statistics(stats: list[Any]) -> pb.ModelStatisticsResponse:
    """msgspec ModelStats (same field names as Triton's proto) as the gRPC message."""
    resp = pb.ModelStatisticsResponse()
    json_format.ParseDict({"model_stats": msgspec.to_builtins(stats)}, resp)
    return resp
