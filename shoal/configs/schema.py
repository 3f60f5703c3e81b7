"""Shared vocabulary of the model-config package: the error type, tensor specs, and the
platform/backend tables.

Kept apart from `model_config` so that validation, auto-complete and the repository
scanner can all import it without import cycles. Everything here is immutable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from shoal.ipc.errors import Code, ServingError


class ConfigError(ServingError):
    """A model configuration that cannot be parsed, completed or accepted.

    `model` is the model name the config belongs to and `message` the full text, worded
    like Triton's own message so clients matching on substrings keep working. The code is
    always INVALID_ARG (HTTP 400 / gRPC INVALID_ARGUMENT).
    """

    def __init__(self, model: str, message: str) -> None:
        super().__init__(Code.INVALID_ARG, message)
        self.model = model


@dataclass(frozen=True, slots=True)
class IOSpec:
    """One tensor as a model file declares it.

    `datatype` is the v2 name ("FP32", "BYTES"); `shape` is the full model shape,
    batch dimension included, with -1 for every dynamic dimension.
    """

    name: str
    datatype: str
    shape: list[int] = field(default_factory=list)


ENSEMBLE_PLATFORM: Final = "ensemble"
PYTHON_BACKEND: Final = "python"

# Triton's platform names and the backend each one implies.
PLATFORM_TO_BACKEND: Final[dict[str, str]] = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorrt_plan": "tensorrt",
    # PyTorch 2 archives (model.pt2): Triton's name for its AOTInductor packages; shoal
    # also runs an ExportedProgram saved by torch.export there (shoal/workers/torch_pt2.py)
    "torch_aoti": "pytorch",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
}
# The platform Triton fills in when only the backend is given (pytorch: LibTorch, "until
# it is deprecated"). The python backend has no platform: Triton leaves it empty.
BACKEND_TO_PLATFORM: Final[dict[str, str]] = {
    "onnxruntime": "onnxruntime_onnx",
    "pytorch": "pytorch_libtorch",
    "tensorrt": "tensorrt_plan",
}
#: A platform's own default model file, where it is not its backend's.
PLATFORM_MODEL_FILENAME: Final[dict[str, str]] = {
    "torch_aoti": "model.pt2",
    "tensorflow_savedmodel": "model.savedmodel",
    "tensorflow_graphdef": "model.graphdef",
}
#: The platform a TensorFlow file name implies (Triton's core: the backend alone does not).
FILENAME_TO_PLATFORM: Final[dict[str, str]] = {
    "model.savedmodel": "tensorflow_savedmodel",
    "model.graphdef": "tensorflow_graphdef",
}
TENSORFLOW_BACKEND: Final = "tensorflow"

DEFAULT_MODEL_FILENAME: Final[dict[str, str]] = {
    "onnxruntime": "model.onnx",
    "pytorch": "model.pt",
    "tensorrt": "model.plan",
    PYTHON_BACKEND: "model.py",
    # (no platform: Triton leaves it empty for OpenVINO models)
    "openvino": "model.xml",
}
FILENAME_TO_BACKEND: Final[dict[str, str]] = {
    **{f: b for b, f in DEFAULT_MODEL_FILENAME.items()},
    "model.pt2": "pytorch",
    "model.savedmodel": "tensorflow",
    "model.graphdef": "tensorflow",
}
#: Tree models (Triton's FIL backend): no platform, and no one default file name (the
#: file's name follows its `model_type` parameter: shoal.configs.fil_params).
FIL_BACKEND: Final = "fil"
#: Triton's test backend, built in (shoal/workers/identity_backend.py): no model file.
IDENTITY_BACKEND: Final = "identity"

# Backends shoal can run. Callers with a plug-in registry pass their own set.
KNOWN_BACKENDS: Final[frozenset[str]] = frozenset(
    [*DEFAULT_MODEL_FILENAME, FIL_BACKEND, TENSORFLOW_BACKEND, IDENTITY_BACKEND]
)
KNOWN_PLATFORMS: Final[frozenset[str]] = frozenset([*PLATFORM_TO_BACKEND, ENSEMBLE_PLATFORM])

# Folders inside a model directory that are never version folders.
NON_VERSION_DIRS: Final[frozenset[str]] = frozenset({"warmup", "initial_state", "configs"})

# What Triton reports as the minimum CUDA compute capability in its gpu-id message.
MIN_COMPUTE_CAPABILITY: Final = 6.0


def shape_str(shape: list[int]) -> str:
    """Triton's ShapeToString: "[-1,16]"."""
    return "[" + ",".join(str(d) for d in shape) + "]"
