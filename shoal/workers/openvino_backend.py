"""OpenVINO models (``backend: "openvino"``, ``model.xml`` + ``model.bin``; OpenVINO also
reads the ``model.onnx`` or other file ``default_model_filename`` names), on the CPU.

As Triton's OpenVINO backend (src/openvino.cc): the config is auto-completed from the
model (shoal.configs.openvino_config), then checked against it at load with Triton's
messages: as many inputs as the model has, each a model input of a data type OpenVINO
converts from (the config's type is what the client sends; OpenVINO's pre-processing
converts it to the model's, and the outputs to the config's), dims that fit the model's
(for inputs the batch dimension and -1 are not compared; for outputs every dim is, as
Triton does). ``RESHAPE_IO_LAYERS`` reshapes the inputs to the config's dims instead.

Batching, where shoal differs: Triton fixes the model's batch dimension at
max_batch_size, so that a smaller batch fails ("expected requests with batch size ...")
unless ``ENABLE_BATCH_PADDING`` pads it with zeros. shoal makes the first dimension of
every input dynamic, so any batch up to max_batch_size runs as it is; with
``SKIP_OV_DYNAMIC_BATCHSIZE`` (for a model whose topology cannot take a dynamic batch)
it fixes it at max_batch_size as Triton does, padding or failing as Triton does.

Threads: ``INFERENCE_NUM_THREADS``, else the instance's own count (one per core it owns),
so that OpenVINO's pool stays on the instance's cores. ``NUM_STREAMS``,
``PERFORMANCE_HINT``, ``HINT_BF16`` are OpenVINO's properties; one the device does not
take (``COMPILATION_NUM_THREADS`` on today's CPU plugin) is left out with a warning.

Inputs are numpy views of shared memory, handed to OpenVINO without a copy
(``share_inputs``); outputs are copied out of OpenVINO's tensors, which the next
inference reuses.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np
import openvino as ov
from openvino.preprocess import PrePostProcessor

from shoal.configs.model_spec import InputSpec, ModelSpec, OutputSpec
from shoal.configs.openvino_config import (
    OvParams,
    OvTensor,
    autocomplete,
    ov_params,
    ov_properties,
)
from shoal.configs.schema import ConfigError, shape_str
from shoal.ipc import datatypes
from shoal.ipc.errors import Code, ServingError

log = logging.getLogger("shoal.worker")

# Triton's OpenVINO backend's types, both ways (no FP64, BF16 or strings).
_CONFIG_OF: Final[dict[str, str]] = {
    "boolean": "TYPE_BOOL", "u8": "TYPE_UINT8", "u16": "TYPE_UINT16", "u32": "TYPE_UINT32",
    "u64": "TYPE_UINT64", "i8": "TYPE_INT8", "i16": "TYPE_INT16", "i32": "TYPE_INT32",
    "i64": "TYPE_INT64", "f16": "TYPE_FP16", "f32": "TYPE_FP32",
}  # fmt: skip
_OV_OF: Final[dict[str, ov.Type]] = {c: getattr(ov.Type, t) for t, c in _CONFIG_OF.items()}


def _ov_error(what: str, exc: Exception) -> str:
    """Triton's "openvino error in <what> : <OpenVINO's message>"."""
    return f"openvino error in {what} : {str(exc).strip()}"


def _tensor(port: Any) -> OvTensor:
    shape = port.get_partial_shape()
    dims = [d.get_length() if d.is_static else -1 for d in shape] if shape.rank.is_static else None
    layout = ov.layout_helpers.get_layout(port)
    return OvTensor(
        port.get_any_name(),
        _CONFIG_OF.get(port.get_element_type().get_type_name(), ""),
        dims,
        ov.layout_helpers.has_batch(layout),
    )


def _matches(dim: Any, want: int) -> bool:
    """Triton's doesMatch: a static dimension equals, an unbounded one takes anything, a
    bounded one takes what is strictly inside its bounds."""
    if dim.is_static:
        return bool(dim.get_length() == want)
    if dim.get_max_length() < 0:
        return True
    return bool(dim.get_min_length() < want < dim.get_max_length())


def _compare_dims(
    model: str, tensor: str, shape: Any, dims: list[int], max_batch: int, exact: bool
) -> None:
    """Triton's CompareDimsSupported for OpenVINO partial shapes; raises ConfigError."""
    signed = [d.get_length() if d.is_static else -1 for d in shape]
    full = [max_batch, *dims] if max_batch > 0 else dims
    if max_batch > 0 and len(signed) == 0:
        raise ConfigError(
            model,
            f"model '{model}', tensor '{tensor}': for the model to support batching the "
            "shape should have at least 1 dimension",
        )
    ok = len(signed) == len(full) and all(
        _matches(shape[i], want)
        for i, want in enumerate(full)
        if max_batch == 0 or exact or (i != 0 and want != -1)
    )
    if ok:
        return
    detail = (
        "an initial batch dimension because max_batch_size > 0 followed by the explicit "
        f"tensor shape, making complete shape {shape_str(full)}"
        if max_batch > 0
        else f"shape {shape_str(full)}"
    )
    raise ConfigError(
        model,
        f"model '{model}', tensor '{tensor}': the model expects {len(signed)} dimensions "
        f"(shape {shape_str(signed)}) but the model configuration specifies {len(full)} "
        f"dimensions ({detail})",
    )


class OpenVinoBackend:
    def __init__(self) -> None:
        self.default_max_batch_size = 4  # the worker sets the server's (auto-complete)
        self._request: Any = None
        self._static_batch = 0  # SKIP_OV_DYNAMIC_BATCHSIZE: the batch the model is fixed at
        self._padding = False

    def _read(self, core: ov.Core, model_file: Path, name: str) -> Any:
        if not model_file.is_file() and not model_file.is_dir():
            raise ConfigError(name, f"unable to find '{model_file}' for model '{name}'")
        try:
            return core.read_model(str(model_file))
        except Exception as exc:
            raise ConfigError(name, _ov_error("reading model", exc)) from None

    def auto_complete(self, model_file: Path, config: Any) -> Any:
        """The config completed from the model, as Triton's OpenVINO backend completes it."""
        model = self._read(ov.Core(), model_file, config.name)
        completed, notes = autocomplete(
            config,
            [_tensor(p) for p in model.inputs],
            [_tensor(p) for p in model.outputs],
            self.default_max_batch_size,
        )
        for note in notes:
            log.info("%s", note)
        return completed

    def load(self, model_file: Path, config: ModelSpec, threads: int, gpu: bool) -> None:
        name = config.name
        if gpu:
            raise ConfigError(
                name,
                f"unable to load model '{name}', Triton OpenVINO backend supports only Kind "
                "CPU and AUTO",
            )
        params = ov_params(config)
        core = ov.Core()
        if params.cpu_extension:
            try:
                core.add_extension(params.cpu_extension)
            except Exception as exc:
                raise ConfigError(name, _ov_error(" loading custom CPU extensions", exc)) from None
        model = self._read(core, model_file, name)
        model = self._configure_inputs(model, config, params)
        model = self._configure_outputs(model, config)
        props = ov_properties(config)
        if "INFERENCE_NUM_THREADS" not in props and threads > 0:
            props["INFERENCE_NUM_THREADS"] = threads
        device = params.target_device
        supported = core.get_property(device, "SUPPORTED_PROPERTIES")
        for key in [k for k in props if k not in supported]:
            log.warning("model '%s': %s does not take %s; left out", name, device, key)
            del props[key]
        try:
            compiled = core.compile_model(model, device, props)
            self._request = compiled.create_infer_request()
        except Exception as exc:
            raise ConfigError(name, _ov_error("loading model", exc)) from None
        log.info(
            "model '%s' compiled for %s: %s streams, %s threads, %s hint, %s precision",
            name, device, compiled.get_property("NUM_STREAMS"),
            compiled.get_property("INFERENCE_NUM_THREADS"),
            compiled.get_property("PERFORMANCE_HINT"),
            compiled.get_property("INFERENCE_PRECISION_HINT"),
        )  # fmt: skip
        self._padding = params.batch_padding

    def _configure_inputs(self, model: Any, config: ModelSpec, params: OvParams) -> Any:
        name, max_batch = config.name, config.max_batch_size
        ports = {p.get_any_name(): p for p in model.inputs}
        if len(ports) != len(config.inputs):
            raise ConfigError(
                name,
                f"unable to load model '{name}', configuration expects {len(config.inputs)} "
                f"inputs, model provides {len(ports)}",
            )
        ppp = PrePostProcessor(model)
        shapes: dict[str, list[Any]] = {}
        for io in config.inputs:
            port = _port(ports, io.name, "input", name)
            ppp.input(io.name).tensor().set_element_type(_ov_type(config, io, "input"))
            dims = list(io.reshape) if io.reshape is not None else list(io.dims)
            shape = list(port.get_partial_shape())
            if params.reshape_io:
                if any(d != -1 and d <= 0 for d in dims):
                    raise ConfigError(
                        name,
                        "openvino backend does not support dimensions values other than `-1` "
                        "or positive integers",
                    )
                start = 1 if max_batch else 0
                shape[start : start + len(dims)] = [ov.Dimension(d) for d in dims]
            else:
                _compare_dims(name, io.name, port.get_partial_shape(), dims, max_batch, False)
            shapes[io.name] = shape
        try:
            model = ppp.build()
        except Exception as exc:
            raise ConfigError(name, _ov_error("apply model input preprocessing", exc)) from None
        if max_batch:
            batch = max_batch if params.skip_dynamic_batch else -1
            self._static_batch = max_batch if params.skip_dynamic_batch else 0
            for shape in shapes.values():
                shape[0] = ov.Dimension(batch)
        if max_batch or params.reshape_io:
            try:
                model.reshape({k: ov.PartialShape(v) for k, v in shapes.items()})
            except Exception as exc:
                raise ConfigError(name, _ov_error("setting max batch size", exc)) from None
        return model

    def _configure_outputs(self, model: Any, config: ModelSpec) -> Any:
        name = config.name
        ports = {p.get_any_name(): p for p in model.outputs}
        ppp = PrePostProcessor(model)
        for io in config.outputs:
            port = _port(ports, io.name, "output", name)
            ppp.output(io.name).tensor().set_element_type(_ov_type(config, io, "output"))
            dims = list(io.reshape) if io.reshape is not None else list(io.dims)
            _compare_dims(
                name, io.name, port.get_partial_shape(), dims, config.max_batch_size, True
            )
        try:
            return ppp.build()
        except Exception as exc:
            raise ConfigError(name, _ov_error("apply model output preprocessing", exc)) from None

    def io_spec(self) -> None:
        """None: auto-complete and the checks against the model happen in this backend
        (Triton's OpenVINO rules), not in the worker's generic ones."""
        return None

    def execute(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: list[str],
        destinations: Mapping[str, np.ndarray] | None = None,  # OpenVINO allocates
    ) -> list[np.ndarray]:
        assert self._request is not None
        feeds = dict(inputs)
        n = len(next(iter(feeds.values()))) if feeds else 0
        padded = self._static_batch and n != self._static_batch
        if padded:
            if not self._padding or n > self._static_batch:
                raise ServingError(
                    Code.INTERNAL,
                    f"expected requests with batch size '{self._static_batch}', got '{n}'... "
                    "this error can be avoided by setting 'ENABLE_BATCH_PADDING' parameter in "
                    "model configuration to 'YES' at a performance cost.",
                )
            feeds = {k: _pad(v, self._static_batch) for k, v in feeds.items()}
        try:
            result = self._request.infer(feeds, share_inputs=True)
        except Exception as exc:
            raise ServingError(Code.INTERNAL, _ov_error("running inference - wait", exc)) from None
        out = [result[o] for o in outputs]
        return [o[:n] for o in out] if padded else out

    def unload(self) -> None:
        self._request = None


def _port(ports: Mapping[str, Any], tensor: str, kind: str, model: str) -> Any:
    if tensor not in ports:
        allowed = ", ".join(sorted(ports))
        raise ConfigError(
            model, f"unexpected inference {kind} '{tensor}', allowed {kind}s are: {allowed}"
        )
    return ports[tensor]


def _ov_type(config: ModelSpec, io: InputSpec | OutputSpec, kind: str) -> ov.Type:
    dt = datatypes.datatype(io.datatype)
    type_name = dt.config_name if dt is not None else "TYPE_INVALID"
    if type_name not in _OV_OF:
        raise ConfigError(
            config.name,
            f"unsupported datatype {type_name} for {kind} '{io.name}' for model '{config.name}'",
        )
    return _OV_OF[type_name]


def _pad(arr: np.ndarray, batch: int) -> np.ndarray:
    """``arr`` with zero rows after its own, ``batch`` rows in all."""
    out = np.zeros((batch, *arr.shape[1:]), dtype=arr.dtype)
    out[: len(arr)] = arr
    return out
