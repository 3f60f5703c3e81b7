"""TensorFlow models: ``tensorflow_savedmodel`` (``model.savedmodel/``, a SavedModel folder)
and ``tensorflow_graphdef`` (``model.graphdef``, a frozen GraphDef), on the CPU.

SavedModel, as Triton's TensorFlow backend reads one: the graph tagged ``TF_GRAPH_TAG``
(``serve``), the signature ``TF_SIGNATURE_DEF`` (``serving_default``; with neither set
nor found, the first signature that is not an init or train one, with a warning). Its
tensors are the signature's input and output keys, with the signature's data types and
shapes: the worker auto-completes the config from them and checks the config against them
(shoal.configs.autocomplete, Triton's rules and messages). TYPE_STRING tensors are
``tf.string`` (BYTES in and out).

GraphDef: the config names graph tensors (``name`` or ``name:0``); the model's inputs are
its Placeholders, checked against the config as a SavedModel's are; a GraphDef does not
complete its config (as in Triton).

Threads: ``TF_NUM_INTRA_THREADS``, else the instance's own count (one per core it owns);
``TF_NUM_INTER_THREADS`` (shoal.configs.tf_params). TensorFlow copies its inputs into its
own tensors (it takes no read-only numpy memory as it is); outputs are its tensors' numpy.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from shoal.configs.model_spec import ModelSpec
from shoal.configs.schema import ConfigError, IOSpec
from shoal.configs.tf_params import tf_params
from shoal.ipc.errors import Code, ServingError

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # (its start-up banner, at import)
import tensorflow as tf

log = logging.getLogger("shoal.worker")

_V2_OF: Final[dict[Any, str]] = {
    tf.bool: "BOOL", tf.uint8: "UINT8", tf.uint16: "UINT16", tf.uint32: "UINT32",
    tf.uint64: "UINT64", tf.int8: "INT8", tf.int16: "INT16", tf.int32: "INT32",
    tf.int64: "INT64", tf.float16: "FP16", tf.float32: "FP32", tf.float64: "FP64",
    tf.string: "BYTES",
}  # fmt: skip
_NOT_SERVING: Final = ("__saved_model_init_op", "__saved_model_train_op")


def _spec(name: str, dtype: Any, shape: Any, kind: str, model: str) -> IOSpec:
    v2 = _V2_OF.get(dtype)
    if v2 is None:
        raise ConfigError(
            model,
            f"unable to process {kind} '{name}' for '{model}', unsupported datatype '{dtype.name}'",
        )
    dims = [] if shape.rank is None else [-1 if d is None else int(d) for d in shape.as_list()]
    return IOSpec(name=name, datatype=v2, shape=dims)


class TensorFlowBackend:
    def __init__(self) -> None:
        self._fn: Any = None
        self._inputs: list[IOSpec] = []
        self._outputs: list[IOSpec] = []
        self._feed_order: list[str] = []  # GraphDef: config input names, in feed order
        self._fetch_order: list[str] = []
        self._loaded: Any = None  # a SavedModel's objects: its variables live with it

    def load(self, model_file: Path, config: ModelSpec, threads: int, gpu: bool) -> None:
        name = config.name
        if gpu:
            raise ConfigError(
                name,
                f"unable to load model '{name}': shoal's TensorFlow backend runs on the CPU "
                "only (tensorflow-cpu); use KIND_CPU",
            )
        if config.platform not in ("tensorflow_savedmodel", "tensorflow_graphdef"):
            raise ConfigError(
                name, f"platform {config.platform} not supported for TensorFlow model '{name}'"
            )
        params = tf_params(config)
        _set_threads(params.intra_op_threads or threads, params.inter_op_threads)
        if not model_file.exists():
            raise ConfigError(name, f"unable to find '{model_file}' for model '{name}'")
        if params.init_ops_file:
            log.warning("model '%s': TF_INIT_OPS_FILE is not run by shoal", name)
        if config.platform == "tensorflow_graphdef":
            self._load_graphdef(model_file, config)
        else:
            self._load_savedmodel(model_file, config, params.graph_tag, params.signature_def)

    def _load_savedmodel(self, path: Path, config: ModelSpec, tag: str, signature: str) -> None:
        name = config.name
        tag = tag or "serve"
        try:
            loaded = tf.saved_model.load(str(path), tags=[tag])
        except Exception as exc:
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                name, f"unable to load model '{name}', expected '{tag}' tag: {why}"
            ) from None
        signatures = dict(loaded.signatures)
        key = signature or "serving_default"
        if key not in signatures and not signature:
            others = [k for k in signatures if k not in _NOT_SERVING]
            if others:
                log.warning(
                    "unable to find serving signature '%s'; using signature '%s'", key, others[0]
                )
                key = others[0]
        if key not in signatures:
            raise ConfigError(name, f"unable to load model '{name}', expected '{key}' signature")
        fn = signatures[key]
        # (a signature's tensors are a map: sorted by name, for a stable completed config)
        specs = sorted(fn.structured_input_signature[1].items())
        self._inputs = [_spec(k, s.dtype, s.shape, "input", name) for k, s in specs]
        results = sorted(fn.structured_outputs.items())
        self._outputs = [_spec(k, s.dtype, s.shape, "output", name) for k, s in results]
        self._loaded = loaded
        self._fn = fn

    def _load_graphdef(self, path: Path, config: ModelSpec) -> None:
        name = config.name
        graph_def = tf.compat.v1.GraphDef()
        try:
            graph_def.ParseFromString(path.read_bytes())
            wrapped = tf.compat.v1.wrap_function(
                lambda: tf.compat.v1.import_graph_def(graph_def, name=""), []
            )
        except Exception as exc:
            raise ConfigError(name, f"unable to load model '{name}': {exc}") from None
        graph = wrapped.graph
        placeholders = [op for op in graph.get_operations() if op.type == "Placeholder"]
        self._inputs = [
            _spec(op.name, op.outputs[0].dtype, op.outputs[0].shape, "input", name)
            for op in placeholders
        ]
        feeds, fetches = [], []
        outputs = []
        for io in config.inputs:
            tensor = _tensor(graph, io.name)
            if tensor is None:
                raise ConfigError(name, f"unexpected inference input '{io.name}'")
            feeds.append(tensor)
        for out in config.outputs:
            tensor = _tensor(graph, out.name)
            if tensor is None:
                raise ConfigError(name, f"unexpected inference output '{out.name}'")
            fetches.append(tensor)
            outputs.append(_spec(out.name, tensor.dtype, tensor.shape, "output", name))
        # config names without ":0" are the Placeholders' names: the model's input names
        self._inputs = [
            IOSpec(name=_config_name(config, s.name), datatype=s.datatype, shape=s.shape)
            for s in self._inputs
        ]
        self._outputs = outputs
        self._feed_order = [io.name for io in config.inputs]
        self._fetch_order = [out.name for out in config.outputs]
        self._fn = wrapped.prune(feeds=feeds, fetches=fetches)

    def io_spec(self) -> tuple[list[IOSpec], list[IOSpec]]:
        """The signature's (or the GraphDef's) tensors: the worker completes and checks the
        config with them."""
        return self._inputs, self._outputs

    def execute(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: list[str],
        destinations: Mapping[str, np.ndarray] | None = None,  # TensorFlow allocates
    ) -> list[np.ndarray]:
        assert self._fn is not None
        try:
            if self._feed_order:
                results = self._fn(*[tf.constant(inputs[n]) for n in self._feed_order])
                by_name = dict(zip(self._fetch_order, results, strict=True))
            else:
                by_name = self._fn(**{k: tf.constant(v) for k, v in inputs.items()})
        except Exception as exc:  # TensorFlow's own error: INTERNAL, as in Triton
            raise ServingError(Code.INTERNAL, str(exc).strip()) from None
        return [by_name[o].numpy() for o in outputs]

    def unload(self) -> None:
        self._fn = None


def _set_threads(intra: int, inter: int) -> None:
    """TensorFlow takes its pool sizes once, before its first op."""
    try:
        if intra > 0:
            tf.config.threading.set_intra_op_parallelism_threads(intra)
        if inter > 0:
            tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError as exc:
        log.warning("TensorFlow thread counts not applied: %s", exc)


def _tensor(graph: Any, name: str) -> Any:
    try:
        return graph.get_tensor_by_name(name if ":" in name else f"{name}:0")
    except (KeyError, ValueError):
        return None


def _config_name(config: ModelSpec, placeholder: str) -> str:
    """The config's name for a Placeholder: ``name`` or ``name:0``."""
    for io in config.inputs:
        if io.name in (placeholder, f"{placeholder}:0"):
            return str(io.name)
    return placeholder
