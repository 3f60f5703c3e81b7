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

from shoal.dataplane.types import (
    EMPTY_FINAL,
    ClientRequest,
    InferenceResult,
    InputTensor,
    ParamValue,
    RequestedOutput,
)
from shoal.ipc import bytes_tensors, datatypes
from shoal.ipc.errors import invalid_arg, named

_SHM_REGION: Final = "shared_memory_region"

# The numpy dtype of each datatype typed contents can carry (each field's values too).
_NUMPY: Final[dict[str, str]] = {
    "BOOL": "bool",
    "INT8": "<i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "UINT8": "<u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "FP32": "<f4",
    "FP64": "<f8",
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


#: The request parameters Triton reads itself, and the kinds it accepts for each, in the
#: order it looks for them.
_RESERVED_PARAMS: Final[dict[str, tuple[tuple[str, ...], str]]] = {
    "sequence_id": (("int64_param", "string_param"), "int64_param or string_param"),
    "sequence_start": (("bool_param",), "bool_param"),
    "sequence_end": (("bool_param",), "bool_param"),
    "priority": (("int64_param", "uint64_param"), "int64_param or uint64_param"),
    "timeout": (("int64_param",), "int64_param"),
}
#: What any other request parameter may be, and the one "triton_" key a client may set.
_PLAIN_KINDS: Final = ("int64_param", "bool_param", "string_param", "double_param")
_ALLOWED_TRITON_KEY: Final = EMPTY_FINAL


def _request_params(src: Any) -> dict[str, ParamValue]:
    """Triton 2.51's checks (SetInferenceRequestMetadata), with its messages."""
    for key, (kinds, expected) in _RESERVED_PARAMS.items():
        if key in src and src[key].WhichOneof("parameter_choice") not in kinds:
            raise invalid_arg(f"invalid value type for '{key}' parameter, expected {expected}.")
    for key, value in src.items():
        if key in _RESERVED_PARAMS:
            continue
        if key.startswith("triton_") and key != _ALLOWED_TRITON_KEY:
            raise invalid_arg(
                "parameter keys starting with 'triton_' are reserved for Triton usage. Only "
                f"the following keys starting with 'triton_' are allowed: {_ALLOWED_TRITON_KEY}"
            )
        if value.WhichOneof("parameter_choice") not in _PLAIN_KINDS:
            raise invalid_arg(
                f"invalid value type for '{key}' parameter, expected int64_param, bool_param, "
                "or string_param."
            )
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


def decode_infer_request(req: pb.ModelInferRequest) -> ClientRequest:
    """A ModelInferRequest as a ClientRequest (tensor data in wire layout), refused
    where Triton 2.51 refuses it, with its words. A datatype Triton does not know goes on
    as "<invalid>" (the model's checks then name it so); shapes are checked there too."""
    parameters = _request_params(req.parameters)  # Triton's order: these, the input
    names: set[str] = set()  # names, then each input's data, then the outputs
    for t in req.inputs:
        if t.name in names:  # Triton's request refuses it, naming itself
            raise invalid_arg(named(f"input '{t.name}' already exists in request", req.id))
        names.add(t.name)
    raw = req.raw_input_contents
    inputs: list[InputTensor] = []
    raw_index = 0
    for t in req.inputs:
        params = _params(t.parameters)
        datatype = t.datatype if datatypes.datatype(t.datatype) is not None else _INVALID
        shape = list(t.shape)
        has_contents = t.HasField("contents")
        if _check_shm_params(t):
            if has_contents:
                raise invalid_arg(
                    "unexpected 'content' provided when using shared memory for input tensor "
                    f"'{t.name}' for model '{req.model_name}'"
                )
            inputs.append(InputTensor(t.name, datatype, shape, None, params))
            continue
        if has_contents and raw:
            raise invalid_arg(
                "contents field must not be specified when using raw_input_contents for "
                f"'{t.name}' for model '{req.model_name}'"
            )
        if has_contents:
            data = _typed_contents(t.contents, t.name, datatype, req.model_name)
        elif raw_index < len(raw):  # raw contents left over at the end are not looked at
            data = memoryview(raw[raw_index])
            raw_index += 1
        else:
            raise invalid_arg(
                f"unable to find data for input tensor '{t.name}' for model "
                f"'{req.model_name}' in request."
            )
        inputs.append(InputTensor(t.name, datatype, shape, data, params))
    outputs: dict[str, RequestedOutput] = {}
    for o in req.outputs:
        in_shm = _check_shm_params(o)
        params = _params(o.parameters)
        if "classification" in o.parameters:
            if o.parameters["classification"].WhichOneof("parameter_choice") != "int64_param":
                raise invalid_arg(
                    "invalid value type for 'classification' parameter, expected int64_param."
                )
            if in_shm:
                raise invalid_arg(
                    "Output can't set both 'shared_memory_region' and 'classification'"
                )
        if o.name in outputs:  # as the current Triton (2.51's gRPC served it once)
            raise invalid_arg(f"output '{o.name}' already exists in request")
        outputs[o.name] = RequestedOutput(o.name, params)
    return ClientRequest(
        model=req.model_name,
        version=req.model_version,
        id=req.id,
        parameters=parameters,
        inputs=inputs,
        outputs=list(outputs.values()),
    )


#: TRITONSERVER_DataTypeString of a datatype string Triton does not know.
_INVALID: Final = "<invalid>"

#: InferTensorContents' fields in the order Triton reads them, each with the datatype its
#: values are (int_contents and uint_contents also carry the 8- and 16-bit types).
_FIELDS: Final = (
    ("bool_contents", "BOOL"),
    ("int_contents", "INT32"),
    ("int64_contents", "INT64"),
    ("uint_contents", "UINT32"),
    ("uint64_contents", "UINT64"),
    ("fp32_contents", "FP32"),
    ("fp64_contents", "FP64"),
    ("bytes_contents", "BYTES"),
)
_NARROW: Final = {"INT8": "INT32", "INT16": "INT32", "UINT8": "UINT32", "UINT16": "UINT32"}


def _typed_contents(contents: Any, name: str, datatype: str, model: str) -> memoryview:
    """The tensor's bytes from its typed contents, as Triton reads them: each field that
    holds values must be of the input's datatype, and only one may hold any. 8- and
    16-bit integers keep the low bytes of each 32-bit value, as Triton's do."""
    data: bytes | memoryview = b""
    for field, field_type in _FIELDS:
        values = getattr(contents, field)
        if not values:
            continue
        if data:
            raise invalid_arg(
                f"unexpected explicit tensor data for input tensor '{name}' for model "
                f"'{model}', binary data was already supplied."
            )
        own = datatype if _NARROW.get(datatype) == field_type else field_type
        if own != datatype:
            raise invalid_arg(
                f"unexpected explicit tensor data for input tensor '{name}' for model "
                f"'{model}' of type '{field_type}', expected datatype '{datatype}'"
            )
        if field_type == "BYTES":
            data = bytes_tensors.pack(list(values)).data
        else:
            wide = np.array(values, dtype=_NUMPY[field_type])
            data = wide.astype(_NUMPY[datatype], copy=False).tobytes()
    return memoryview(data)


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


def model_config(config: bytes) -> pb.ModelConfigResponse:
    """The ModelConfig response for a serialized, completed config (as the broker sends it)."""
    response = pb.ModelConfigResponse()
    response.config.MergeFromString(config)
    return response


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


def check_load_parameters(params: Any) -> None:
    """A RepositoryModelLoadRequest's parameters, as Triton 2.51 checks them: each named
    ``config`` (a string_param) or ``file:<path>`` (a bytes_param)."""
    for key in sorted(params):
        if key != "config" and not key.startswith("file:"):
            raise invalid_arg(f"unrecognized load parameter '{key}'.")
    for key in sorted(params):
        want = "string_param" if key == "config" else "bytes_param"
        if params[key].WhichOneof("parameter_choice") != want:
            raise invalid_arg(f"invalid value type for load parameter '{key}', expected {want}.")


def check_unload_parameters(params: Any) -> None:
    """``unload_dependents``, if given, is a bool_param; other parameters are ignored."""
    if (
        "unload_dependents" in params
        and params["unload_dependents"].WhichOneof("parameter_choice") != "bool_param"
    ):
        raise invalid_arg(
            "invalid value type for 'unload_dependents' parameter, expected bool_param."
        )
