"""KServe v2 / Triton HTTP inference bodies <-> the frontend's transport-agnostic types.

Pure: bytes in, ``shoal.dataplane.types`` out and back, no sockets or aiohttp objects, safe to
call from any thread. Client faults raise ``ServingError`` with Triton's messages
(INVALID_ARG -> HTTP 400 unless noted). Decoded input ``data`` views point into the
request body for binary inputs, so the body must outlive the request.

Deviations from Triton, on purpose:
- FP16 and BF16 are accepted in JSON ``data`` (BF16 rounds fp32 to nearest even) and
  written as JSON numbers in responses; Triton rejects both.
- BYTES outputs that are not valid UTF-8 are written to JSON with replacement
  characters (Triton writes the raw bytes, which is not valid JSON).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from shoal.dataplane.json_tensors import (
    INT64_MAX,
    depth_exceeded,
    json_error,
    tensor_from_json,
    tensor_to_json,
)
from shoal.dataplane.types import (
    ClientRequest,
    InferenceResult,
    InputTensor,
    ParamValue,
    RequestedOutput,
)
from shoal.frontend.http_raw_input import RawInputMeta, raw_input_tensor
from shoal.ipc.datatypes import DataType, datatype, element_count
from shoal.ipc.errors import Code, ServingError, invalid_arg, named

__all__ = [
    "OutputEncoding",
    "RawInputMeta",
    "ResponseOptions",
    "decode_infer_request",
    "encode_error",
    "encode_infer_response",
]

_SHM_REGION: Final = "shared_memory_region"
_SHM_OFFSET: Final = "shared_memory_offset"
_SHM_SIZE: Final = "shared_memory_byte_size"
_UINT64_MAX: Final = 2**64 - 1


@dataclass(slots=True)
class OutputEncoding:
    """How one output goes back: binary after the JSON header, or JSON ``data``."""

    binary: bool = False


@dataclass(slots=True)
class ResponseOptions:
    """Per-request response settings decided while decoding the request.

    ``outputs`` holds the explicitly requested outputs; any other output (the request
    listed none) follows ``default_binary``, the request's ``binary_data_output``.
    """

    default_binary: bool = False
    outputs: dict[str, OutputEncoding] = field(default_factory=dict)

    def encoding(self, name: str) -> OutputEncoding:
        enc = self.outputs.get(name)
        return enc if enc is not None else OutputEncoding(binary=self.default_binary)


def decode_infer_request(
    body: bytes | memoryview,
    header_length: int | None,
    model: str,
    version: str,
    *,
    raw_input_meta: Callable[[], RawInputMeta] | None = None,
    max_json_depth: int = 100,
) -> tuple[ClientRequest, ResponseOptions]:
    """Decode an ``/infer`` body.

    ``header_length`` is the Inference-Header-Content-Length value: None when absent (the
    body is all JSON), 0 for a raw binary request (then ``raw_input_meta`` is required).
    """
    buf = memoryview(body)
    if buf.format != "B" or buf.ndim != 1:
        buf = buf.cast("B")
    if header_length is not None and not 0 <= header_length <= len(buf):
        raise invalid_arg(
            f"inference header size should be in range (0, {len(buf)}), got: {header_length}"
        )
    if header_length == 0:
        if raw_input_meta is None:
            raise invalid_arg(
                "must specify valid 'Infer-Header-Content-Length' in request header when "
                "sending a raw binary request"
            )
        tensor = raw_input_tensor(buf, model, raw_input_meta())
        request = ClientRequest(model=model, version=version, inputs=[tensor])
        return request, ResponseOptions(default_binary=True)
    split = len(buf) if header_length is None else header_length
    doc = parse_json(buf[:split], max_json_depth)
    request = ClientRequest(model=model, version=version)
    options = ResponseOptions()
    request.id = _request_id(doc)
    request.parameters, options.default_binary = _request_parameters(doc)
    request.inputs = _inputs(doc, buf[split:], model, max_json_depth, request.id)
    request.outputs, options.outputs = _outputs(doc)
    return request, options


def parse_json(header: memoryview, max_depth: int) -> dict[str, Any]:
    """A request's JSON as Triton reads it: unparsable (an empty body too) is INTERNAL;
    a root that is no object has no members."""
    try:
        doc = msgspec.json.decode(header)
    except RecursionError:
        raise depth_exceeded(max_depth) from None
    except msgspec.DecodeError as exc:
        doc = _parse_non_finite(header, max_depth, exc)
    # Another root has no members: Triton then misses the required 'inputs'.
    return doc if isinstance(doc, dict) else {}


def _parse_non_finite(header: memoryview, max_depth: int, exc: Exception) -> Any:
    """Triton's JSON reader takes the tokens NaN, Infinity and -Infinity (tritonclient
    writes them for such floats); strict JSON, and msgspec, do not. Such a body is read
    again by Python's json, which takes them too; any other malformed body is refused."""
    raw = bytes(header)
    if b"NaN" not in raw and b"Infinity" not in raw:
        raise _unparsable(exc) from None
    try:
        return json.loads(raw)
    except RecursionError:
        raise depth_exceeded(max_depth) from None
    except ValueError:
        raise _unparsable(exc) from None


def _unparsable(exc: Exception) -> ServingError:
    # INTERNAL (HTTP 500), as Triton 2.51's JSON layer; the detail is msgspec's words
    return ServingError(Code.INTERNAL, f"failed to parse the request JSON buffer: {exc}")


def _is_uint(v: object) -> bool:
    return type(v) is int and 0 <= v <= _UINT64_MAX


def _request_id(doc: dict[str, Any]) -> str:
    rid = doc.get("id", "")
    if not isinstance(rid, str):
        raise json_error("id", "attempt to access JSON non-string as string")
    return rid


def _request_parameters(doc: dict[str, Any]) -> tuple[dict[str, ParamValue], bool]:
    raw = doc.get("parameters")
    if raw is None:
        return {}, False
    if not isinstance(raw, dict):
        raise ServingError(
            Code.INTERNAL, "failed to get request params.: attempt to get members for non-object"
        )
    params: dict[str, ParamValue] = {}
    binary_output = False
    for key, value in raw.items():
        if key.startswith("triton_"):
            raise invalid_arg(
                "parameter keys starting with 'triton_' are reserved for Triton usage "
                "and should not be specified."
            )
        if key == "binary_data_output":
            if type(value) is not bool:
                raise json_error(key, "attempt to access JSON non-boolean as boolean")
            binary_output = value
            continue
        _check_reserved_type(key, value)
        if not isinstance(value, bool | int | float | str):
            raise invalid_arg(
                f"parameter '{key}' has invalid type. It should be either "
                "'int', 'bool', or 'string'."
            )
        params[key] = value
    return params, binary_output


def _check_reserved_type(key: str, value: object) -> None:
    """Triton 2.51's JSON layer (500, in its words): a sequence_id that is no uint64 is
    read as a string, the flags as booleans, priority and timeout as uint64s."""
    if key == "sequence_id" and not (_is_uint(value) or isinstance(value, str)):
        raise json_error(key, "attempt to access JSON non-string as string")
    if key in ("sequence_start", "sequence_end") and type(value) is not bool:
        raise json_error(key, "attempt to access JSON non-boolean as boolean")
    if key in ("priority", "timeout") and not _is_uint(value):
        raise _not_uint(key)


def _not_uint(key: str) -> ServingError:
    return json_error(key, "attempt to access JSON non-unsigned-integer as unsigned-integer")


def _member(obj: dict[str, Any], key: str, kind: type, what: str) -> Any:
    if key not in obj:
        raise json_error(key, f"attempt to access non-existing object member '{key}'")
    value = obj[key]
    if not isinstance(value, kind) or (kind is not bool and type(value) is bool):
        raise json_error(key, f"attempt to access JSON non-{what} as {what}")
    return value


def _shape(tensor: dict[str, Any]) -> list[int]:
    dims = _member(tensor, "shape", list, "array")
    if not all(map(_is_uint, dims)):
        raise _not_uint("shape")
    return dims


def _check_size(name: str, dt: DataType | None, shape: list[int]) -> int:
    count = 1
    for d in shape:
        count *= d
        if count > INT64_MAX:
            raise invalid_arg(
                f"The provided shape {shape} for input '{name}' causes total element count "
                f"to exceed maximum size of {INT64_MAX}"
            )
    if dt is not None and dt.itemsize and count * dt.itemsize > INT64_MAX:
        raise invalid_arg(f"byte size overflow for input '{name}'")
    return count


def _content_kind(tensor: dict[str, Any], params: dict[str, Any]) -> str:
    has = {
        "data": "data" in tensor,
        "binary_data_size": "binary_data_size" in params,
        _SHM_REGION: _SHM_REGION in params,
    }
    set_ = [k for k, v in has.items() if v]
    if len(set_) != 1:
        detail = " no field is set" if not set_ else " set" + "".join(f" '{k}'" for k in set_)
        raise invalid_arg(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            "'parameters', 'shared_memory_region' in 'parameters'. But" + detail
        )
    return set_[0]


def _tensor_params(tensor: dict[str, Any]) -> dict[str, Any]:
    """A tensor's parameters; Triton reads members of an object only, so 'parameters'
    that is not one counts as none."""
    params = tensor.get("parameters", {})
    return params if isinstance(params, dict) else {}


def _check_shm(params: dict[str, Any]) -> None:
    """Parse checks of the shared-memory parameters, as Triton's CheckSharedMemoryData:
    only 'shared_memory_region' puts a tensor in shared memory; an offset or a byte size
    without it is parsed and otherwise ignored, and a region without a byte size has 0
    bytes (which then fails the tensor's own size check)."""
    if _SHM_REGION in params and not isinstance(params[_SHM_REGION], str):
        # INTERNAL (HTTP 500), the answer of Triton 2.51's JSON layer
        raise ServingError(
            Code.INTERNAL,
            f"Unable to parse '{_SHM_REGION}': attempt to access JSON non-string as string",
        )
    for key in (_SHM_OFFSET, _SHM_SIZE):
        if key in params and not _is_uint(params[key]):
            raise _not_uint(key)
    if _SHM_REGION in params:
        params.setdefault(_SHM_SIZE, 0)


def _inputs(
    doc: dict[str, Any],
    binary: memoryview,
    model: str,
    max_depth: int,
    request_id: str,
) -> list[InputTensor]:
    items = _member(doc, "inputs", list, "array")
    inputs: list[InputTensor] = []
    seen: set[str] = set()
    pos = 0
    for item in items:
        # an item that is no object has no members (Triton then misses its content)
        item = item if isinstance(item, dict) else {}
        tensor, used = _input(item, binary[pos:], model, max_depth)
        if tensor.name in seen:
            # Triton's request refuses it, naming itself
            raise invalid_arg(named(f"input '{tensor.name}' already exists in request", request_id))
        seen.add(tensor.name)
        inputs.append(tensor)
        pos += used
    if pos != len(binary):
        raise invalid_arg(f"unexpected additional input data for model '{model}'")
    return inputs


def _input(
    item: dict[str, Any], binary: memoryview, model: str, max_depth: int
) -> tuple[InputTensor, int]:
    """One input and how many bytes of the binary section it consumed. Triton's order:
    where the content is first, then name, datatype and shape."""
    params = _tensor_params(item)
    kind = _content_kind(item, params)
    name = _member(item, "name", str, "string")
    type_name = _member(item, "datatype", str, "string")
    shape = _shape(item)
    dt = datatype(type_name)
    if dt is None:
        raise invalid_arg(f"invalid datatype for input {name}")
    count = _check_size(name, dt, shape)
    tensor = InputTensor(name=name, datatype=type_name, shape=shape, data=None)
    if kind != "binary_data_size":  # Triton reads them only for an input not in binary
        _check_shm(params)
    if kind == _SHM_REGION:
        tensor.parameters = dict(params)
        return tensor, 0
    tensor.parameters = {k: v for k, v in params.items() if k != "binary_data_size"}
    if kind == "data":
        data = item["data"]
        if not isinstance(data, list):
            raise json_error("data", "attempt to access JSON non-array as array")
        tensor.data = tensor_from_json(name, dt, data, count, model, max_depth)
        return tensor, 0
    size = params["binary_data_size"]
    if not _is_uint(size):
        raise _not_uint("binary_data_size")
    # Without Inference-Header-Content-Length the whole body is JSON and no binary
    # section follows: Triton 2.51 (triton-peer) then answers the size check below.
    if size > len(binary):
        raise invalid_arg(
            f"unexpected size for input '{name}', expecting {size - len(binary)} additional "
            f"bytes for model '{model}'"
        )
    tensor.data = binary[:size]  # sizes and element counts: checked by the data plane
    return tensor, size


def _outputs(
    doc: dict[str, Any],
) -> tuple[list[RequestedOutput], dict[str, OutputEncoding]]:
    if "outputs" not in doc:
        return [], {}
    items = _member(doc, "outputs", list, "array")
    outputs: list[RequestedOutput] = []
    encodings: dict[str, OutputEncoding] = {}
    for item in items:
        item = item if isinstance(item, dict) else {}
        name = _member(item, "name", str, "string")
        if name in encodings:
            raise invalid_arg(f"output '{name}' already exists in request")
        params = _tensor_params(item)
        enc = _output_encoding(params)
        encodings[name] = enc
        outputs.append(
            RequestedOutput(name, {k: v for k, v in params.items() if k != "binary_data"})
        )
    return outputs, encodings


def _output_encoding(params: dict[str, Any]) -> OutputEncoding:
    binary = params.get("binary_data", False)
    if _SHM_REGION in params:  # Triton's ValidateOutputParameter, before anything is read
        if "classification" in params:
            raise invalid_arg("Output can't set both 'shared_memory_region' and 'classification'")
        if type(binary) is not bool:
            raise ServingError(
                Code.INTERNAL,
                "Unable to set 'binary_data': attempt to access JSON non-boolean as boolean",
            )
        if binary:
            raise invalid_arg("Output can't set both 'shared_memory_region' and 'binary_data'")
    if type(binary) is not bool:
        raise json_error("binary_data", "attempt to access JSON non-boolean as boolean")
    classes = params.get("classification", 0)
    if not _is_uint(classes):
        raise invalid_arg("Unable to set 'classification'")
    _check_shm(params)
    return OutputEncoding(binary=binary)


def encode_infer_response(
    result: InferenceResult, options: ResponseOptions
) -> tuple[list[bytes | memoryview], int | None]:
    """Body parts (JSON header first, then binary outputs in order) and the
    Inference-Header-Content-Length value, None when no output is binary.

    Binary parts are the result's own views, so ``result.release()`` must wait until
    the body has been written. Raises ServingError(INTERNAL) when an output's data does
    not match its shape.
    """
    outputs: list[dict[str, Any]] = []
    chunks: list[bytes | memoryview] = []
    for out in result.outputs:
        entry: dict[str, Any] = {"name": out.name, "datatype": out.datatype, "shape": out.shape}
        params: dict[str, Any] = dict(out.parameters)
        if out.data is not None:
            enc = options.encoding(out.name)
            if enc.binary:
                params["binary_data_size"] = out.data.nbytes
                chunks.append(out.data)
            else:
                entry["data"] = _json_data(out.name, out.datatype, out.shape, out.data)
        if params:
            entry["parameters"] = params
        outputs.append(entry)
    response: dict[str, Any] = {
        "model_name": result.model_name,
        "model_version": result.model_version,
    }
    if result.id:
        response["id"] = result.id
    if result.parameters:
        response["parameters"] = result.parameters
    response["outputs"] = outputs
    header = msgspec.json.encode(response)
    if not chunks:
        return [header], None
    return [header, *chunks], len(header)


def _json_data(
    name: str, type_name: str, shape: list[int], data: memoryview
) -> list[Any] | msgspec.Raw:
    dt = datatype(type_name)
    if dt is None:
        raise ServingError(Code.INTERNAL, "Invalid data type for output tensor")
    view = data if data.format == "B" and data.ndim == 1 else data.cast("B")
    return tensor_to_json(name, dt, element_count(shape), view)


def encode_error(message: str) -> bytes:
    """The HTTP error body, ``{"error":"<message>"}``. A message may quote what a client
    sent that is not UTF-8 (a header's bytes come as lone surrogates): those are written
    as escapes, not refused by the JSON encoder."""
    try:
        return msgspec.json.encode({"error": message})
    except UnicodeEncodeError:
        text = message.encode("utf-8", "backslashreplace").decode("utf-8")
        return msgspec.json.encode({"error": text})
