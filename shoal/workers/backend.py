"""The contract every model backend implements, and the registry of backends by name.

A backend runs inside one worker process and is driven by one thread: no locking.
Heavy imports (onnxruntime, torch, tensorrt) happen inside the backend module, so that
importing this registry stays cheap and the other roles never pay for them.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import numpy as np

from shoal.configs.model_spec import ModelSpec
from shoal.configs.schema import IOSpec


class Backend(Protocol):
    def load(self, model_file: Path, config: ModelSpec, threads: int, gpu: bool) -> None:
        """Load the model (on the process's one visible GPU when ``gpu``) as ``config``
        says (the config after the backend's own auto-complete); raises on failure (the
        message reaches the operator)."""

    def io_spec(self) -> tuple[list[IOSpec], list[IOSpec]] | None:
        """The model's own inputs and outputs, for config auto-complete and checks; None
        when the model file does not describe them (TorchScript: the config must)."""

    def execute(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: list[str],
        destinations: Mapping[str, np.ndarray] | None = None,
    ) -> list[np.ndarray]:
        """Run one batch. Arrays are in wire layout; BYTES inputs are object arrays of
        ``bytes``. Returns the requested outputs in order.

        ``destinations``: writable host arrays of exactly the shape and dtype some outputs
        will have (views of where the request wants them: its client's region, a slot of
        the frontend's slab). A backend may have the model write such an output there
        and return that very array, which then needs no copy; one that cannot ignores
        them."""

    def unload(self) -> None: ...


# backend name -> "module:Class"; platforms map to backends in shoal.configs.model_config.
_BACKENDS: dict[str, str] = {
    "onnxruntime": "shoal.workers.onnx_backend:OnnxRuntimeBackend",
    "pytorch": "shoal.workers.torch_backend:TorchBackend",
    "python": "shoal.workers.python_backend:PythonBackend",
    "fil": "shoal.workers.fil_backend:FilBackend",
    "openvino": "shoal.workers.openvino_backend:OpenVinoBackend",
    "tensorflow": "shoal.workers.tf_backend:TensorFlowBackend",
    "tensorrt": "shoal.workers.tensorrt_backend:TensorRtBackend",
    "identity": "shoal.workers.identity_backend:IdentityBackend",
}


def create(backend: str) -> Backend:
    target = _BACKENDS.get(backend)
    if target is None:
        raise ValueError(f"backend '{backend}' is not supported by this server")
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)()  # type: ignore[no-any-return]
