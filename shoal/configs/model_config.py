"""The model configuration: Triton's `ModelConfig` protobuf, parsed, completed and rendered.

Flow for one model: `parse_config_text` (config.pbtxt) or `parse_config_json` (the load
API's override) -> `fill_defaults` -> `validate` -> [backend auto-complete, then
`validate_io`]. `config_to_json` and `model_metadata` render it for the HTTP/gRPC
frontends exactly as Triton does. All functions are pure except `fill_defaults`, which
completes its argument in place. The protobuf type never leaves the config parser and
the gRPC adapter: other packages read the fields they need.
"""

from __future__ import annotations

import json
from collections.abc import Container
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2 as pb

from shoal.configs.schema import (
    BACKEND_TO_PLATFORM,
    DEFAULT_MODEL_FILENAME,
    ENSEMBLE_PLATFORM,
    FILENAME_TO_BACKEND,
    FILENAME_TO_PLATFORM,
    PLATFORM_MODEL_FILENAME,
    PLATFORM_TO_BACKEND,
    ConfigError,
    IOSpec,
)
from shoal.configs.validation import validate, validate_instance_groups, validate_io
from shoal.ipc.datatypes import from_config_name

ModelConfig = pb.ModelConfig

__all__ = [
    "ConfigError",
    "IOSpec",
    "ModelConfig",
    "config_to_json",
    "fill_defaults",
    "fill_preferred_batch_size",
    "model_metadata",
    "parse_config_json",
    "parse_config_text",
    "validate",
    "validate_instance_groups",
    "validate_io",
]

# shoal runs one CPU instance per group unless told otherwise (Triton: 2 for onnxruntime).
DEFAULT_INSTANCE_COUNT = 1

_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def parse_config_text(text: str, model_name: str) -> pb.ModelConfig:
    """Parse config.pbtxt text. Raises ConfigError "failed to load '<m>': <line:col: why>"."""
    config = pb.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as err:
        raise ConfigError(model_name, f"failed to load '{model_name}': {err}") from None
    return config


def parse_config_json(text: str, model_name: str) -> pb.ModelConfig:
    """Parse the JSON config of a load request (Triton's JsonToModelConfig).

    The config may be partial; 64-bit integers may be JSON strings or numbers, enum
    names are matched case-insensitively and a repeated field may be given one element
    in place of a list (protobuf's C++ parser, with its legacy syntax, as Triton calls
    it). Unknown fields are an error, as in Triton.
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(model_name, f"failed to load '{model_name}': {err}") from None
    except RecursionError:  # (the frontends refuse such a config first)
        raise ConfigError(
            model_name, f"failed to load '{model_name}': the config JSON is nested too deeply"
        ) from None
    if not isinstance(doc, dict):
        raise ConfigError(
            model_name, f"failed to load '{model_name}': model config JSON must be an object"
        )
    _as_triton_reads(doc, pb.ModelConfig.DESCRIPTOR)
    config = pb.ModelConfig()
    try:
        json_format.ParseDict(doc, config, ignore_unknown_fields=False)
    except json_format.ParseError as err:
        raise ConfigError(model_name, f"failed to load '{model_name}': {err}") from None
    return config


def _as_triton_reads(doc: dict[str, Any], desc: Descriptor) -> None:
    """Rewrite a JSON config, in place, into what Python's protobuf parser reads as
    Triton's parser reads the original: enum names upper-cased (case-insensitive enum
    parsing), one element given for a repeated field made a list of it."""
    for key, value in doc.items():
        field = desc.fields_by_name.get(key) or _field_by_json_name(desc, key)
        if field is None:
            continue
        repeated = field.is_repeated
        map_field = field.type == FieldDescriptor.TYPE_MESSAGE and (
            field.message_type.GetOptions().map_entry
        )
        if repeated and not map_field and value is not None and not isinstance(value, list):
            doc[key] = value = [value]
        if field.type == FieldDescriptor.TYPE_ENUM:
            if isinstance(value, str):
                doc[key] = value.upper()
            elif isinstance(value, list):
                doc[key] = [v.upper() if isinstance(v, str) else v for v in value]
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            for child, child_desc in _children(field, value):
                if isinstance(child, dict):
                    _as_triton_reads(child, child_desc)


def _field_by_json_name(desc: Descriptor, key: str) -> FieldDescriptor | None:
    return next((f for f in desc.fields if f.json_name == key), None)


def _children(field: FieldDescriptor, value: Any) -> list[tuple[Any, Descriptor]]:
    """(sub-document, descriptor) pairs below a message-typed field of a JSON document."""
    msg = field.message_type
    if msg.GetOptions().map_entry:
        value_field = msg.fields_by_name["value"]
        if value_field.type != FieldDescriptor.TYPE_MESSAGE or not isinstance(value, dict):
            return []
        return [(v, value_field.message_type) for v in value.values()]
    if isinstance(value, list):
        return [(v, msg) for v in value]
    return [(value, msg)]


def fill_defaults(
    config: pb.ModelConfig,
    model_name: str,
    *,
    gpu_count: int = 0,
    cpu_only_backends: Container[str] = (),
) -> pb.ModelConfig:
    """Fill what Triton fills even with auto-complete disabled; returns `config`.

    - `name` from the directory name when empty;
    - the platform <-> backend pair (onnxruntime_onnx <-> onnxruntime, pytorch_libtorch
      <-> pytorch, torch_aoti -> pytorch, tensorrt_plan <-> tensorrt; model.py -> python)
      and `default_model_filename` (model.onnx, model.pt, model.pt2 for torch_aoti,
      model.plan, model.py, model.xml, model.savedmodel / model.graphdef, whose names also
      give a tensorflow model its platform);
    - `version_policy` latest { num_versions: 1 };
    - `dynamic_batching.preferred_batch_size` (see `fill_preferred_batch_size`);
    - for every model but an ensemble (Triton rejects both fields on ensembles):
      - instance groups: when none is given, one group named after the model; a listed
        group without a name gets "<model>_<index>"; KIND_AUTO resolved to KIND_GPU
        (all of GPUs 0..gpu_count-1) or KIND_CPU when there is no GPU or the model's
        backend is one of `cpu_only_backends` (its runtime cannot use one), KIND_GPU
        without ids gets all GPUs, and a count < 1 becomes DEFAULT_INSTANCE_COUNT;
      - `optimization.input_pinned_memory` / `output_pinned_memory` enabled when unset.
    Other scheduling settings are left as given.
    """
    if not config.name:
        config.name = model_name
    _fill_backend_fields(config)
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    fill_preferred_batch_size(config)
    if not config.HasField("ensemble_scheduling") and config.platform != ENSEMBLE_PLATFORM:
        auto_gpus = 0 if config.backend in cpu_only_backends else gpu_count
        _fill_instance_groups(config, gpu_count, auto_gpus)
        _fill_pinned_memory(config)
    return config


def fill_preferred_batch_size(config: pb.ModelConfig) -> None:
    """Set `dynamic_batching.preferred_batch_size` to [max_batch_size] when it is empty.

    Only for a model with `dynamic_batching` and max_batch_size > 0. Triton's
    NormalizeModelConfig rule; Triton runs it again after a backend's auto-complete
    (UpdateModelConfig), so `autocomplete` calls it too once it has set max_batch_size.
    """
    if not config.HasField("dynamic_batching") or config.max_batch_size <= 0:
        return
    db = config.dynamic_batching
    if not db.preferred_batch_size:
        db.preferred_batch_size.append(config.max_batch_size)


def _fill_backend_fields(config: pb.ModelConfig) -> None:
    if not config.backend:
        if config.platform in PLATFORM_TO_BACKEND:
            config.backend = PLATFORM_TO_BACKEND[config.platform]
        elif config.default_model_filename in FILENAME_TO_BACKEND:
            # (as core's AutoCompleteBackendFields: the platform's, or the file name's;
            # an unknown platform then fails validation as a pair)
            config.backend = FILENAME_TO_BACKEND[config.default_model_filename]
    if not config.platform and config.backend in BACKEND_TO_PLATFORM:
        config.platform = BACKEND_TO_PLATFORM[config.backend]
    if not config.platform and config.backend == PLATFORM_TO_BACKEND.get(
        FILENAME_TO_PLATFORM.get(config.default_model_filename, "")
    ):
        config.platform = FILENAME_TO_PLATFORM[config.default_model_filename]
    if not config.default_model_filename and config.platform in PLATFORM_MODEL_FILENAME:
        config.default_model_filename = PLATFORM_MODEL_FILENAME[config.platform]
    if not config.default_model_filename and config.backend in DEFAULT_MODEL_FILENAME:
        config.default_model_filename = DEFAULT_MODEL_FILENAME[config.backend]


def _fill_instance_groups(config: pb.ModelConfig, gpu_count: int, auto_gpus: int) -> None:
    if len(config.instance_group) == 0:
        # Triton's NormalizeInstanceGroup names the group it adds after the model.
        config.instance_group.add(name=config.name, kind=pb.ModelInstanceGroup.KIND_AUTO)
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == pb.ModelInstanceGroup.KIND_AUTO:
            on_gpu = auto_gpus > 0 and all(0 <= g < auto_gpus for g in group.gpus)
            group.kind = (
                pb.ModelInstanceGroup.KIND_GPU if on_gpu else pb.ModelInstanceGroup.KIND_CPU
            )
        if group.count < 1:  # Triton: count() < 1 -> SetDefaultInstanceCount
            group.count = DEFAULT_INSTANCE_COUNT
        if group.kind == pb.ModelInstanceGroup.KIND_GPU and len(group.gpus) == 0:
            group.gpus.extend(range(gpu_count))


def _fill_pinned_memory(config: pb.ModelConfig) -> None:
    """Enable pinned input/output memory when unset, as Triton's NormalizeModelConfig.

    shoal does not use the setting; it is filled so that `/config` matches Triton's.
    """
    optimization = config.optimization
    if not optimization.HasField("input_pinned_memory"):
        optimization.input_pinned_memory.enable = True
    if not optimization.HasField("output_pinned_memory"):
        optimization.output_pinned_memory.enable = True


def config_to_json(config: pb.ModelConfig) -> dict[str, Any]:
    """The config as Triton's GET /v2/models/<m>/config returns it.

    protobuf JSON with proto field names, every field without presence printed (defaults
    included), enums as names; then every 64-bit integer turned from a JSON string into
    a JSON number. Map keys stay strings, as JSON requires.
    """
    doc = _message_to_dict(config)
    _int64_to_numbers(doc, pb.ModelConfig.DESCRIPTOR)
    return doc


def _message_to_dict(message: Message) -> dict[str, Any]:
    try:
        return json_format.MessageToDict(
            message,
            preserving_proto_field_name=True,
            always_print_fields_with_no_presence=True,
        )
    except TypeError:  # protobuf < 5.26 spells the option differently
        return json_format.MessageToDict(  # type: ignore[call-arg]
            message, preserving_proto_field_name=True, including_default_value_fields=True
        )


def _int64_to_numbers(doc: dict[str, Any], desc: Descriptor) -> None:
    for key, value in doc.items():
        field = desc.fields_by_name.get(key)
        if field is None:
            continue
        if field.type in _INT64_TYPES:
            doc[key] = [int(v) for v in value] if isinstance(value, list) else int(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            msg = field.message_type
            value_field = msg.fields_by_name.get("value") if msg.GetOptions().map_entry else None
            if value_field is not None and value_field.type in _INT64_TYPES:
                doc[key] = {k: int(v) for k, v in value.items()}
                continue
            for child, child_desc in _children(field, value):
                if isinstance(child, dict):
                    _int64_to_numbers(child, child_desc)


def model_metadata(config: pb.ModelConfig, versions: list[int]) -> dict[str, Any]:
    """Triton's model metadata: name, versions (strings), platform, inputs, outputs.

    A tensor's shape is its config dims, with -1 prepended when max_batch_size > 0;
    its datatype is the v2 name (TYPE_STRING -> BYTES). The platform falls back to the
    backend name when the config has no platform (python models).
    """
    batch = [-1] if config.max_batch_size > 0 else []
    return {
        "name": config.name,
        "versions": [str(v) for v in versions],
        "platform": config.platform or config.backend,
        "inputs": [_tensor_metadata(io, batch) for io in config.input],
        "outputs": [_tensor_metadata(io, batch) for io in config.output],
    }


def _tensor_metadata(io: pb.ModelInput | pb.ModelOutput, batch: list[int]) -> dict[str, Any]:
    return {
        "name": io.name,
        "datatype": v2_datatype(io.data_type),
        "shape": batch + list(io.dims),
    }


def v2_datatype(data_type: int) -> str:
    """The v2 wire name of a config DataType enum value ("INVALID" for TYPE_INVALID)."""
    dt = from_config_name(pb.DataType.Name(data_type))
    return dt.name if dt is not None else "INVALID"


def io_specs(config: pb.ModelConfig) -> tuple[list[IOSpec], list[IOSpec]]:
    """Inputs and outputs of a config as IOSpecs with full shapes (batch dim included)."""
    batch = [-1] if config.max_batch_size > 0 else []

    def spec(io: pb.ModelInput | pb.ModelOutput) -> IOSpec:
        return IOSpec(io.name, v2_datatype(io.data_type), batch + list(io.dims))

    return [spec(io) for io in config.input], [spec(io) for io in config.output]
