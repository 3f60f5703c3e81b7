"""The accelerators this host has, found without importing CUDA (so that the frontend
and broker stay free of it, and no CUDA context is created before workers fork)."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from collections.abc import Mapping
from pathlib import Path

_NVIDIA_PROC = Path("/proc/driver/nvidia/gpus")
_DEV = Path("/dev")
_DEVICE_FILE = re.compile(r"nvidia[0-9]+")


def _present() -> int:
    """The NVIDIA GPUs the driver shows: its /proc folder, or, where that is missing (a
    sandbox that emulates the device files, gVisor's nvproxy), the /dev/nvidia<N> files."""
    try:
        count = sum(1 for _ in _NVIDIA_PROC.iterdir())
    except OSError:
        count = 0
    if count:
        return count
    try:
        return sum(1 for f in _DEV.iterdir() if _DEVICE_FILE.fullmatch(f.name))
    except OSError:
        return 0


def visible_ids(visible: str) -> list[str]:
    """CUDA_VISIBLE_DEVICES's entries as CUDA reads them: indices and GPU-/MIG- UUIDs, up
    to the first entry it cannot read, which hides the rest ("0,-1,1" shows device 0)."""
    out: list[str] = []
    for raw in visible.split(","):
        v = raw.strip()
        if not (v.isdigit() or v.startswith(("GPU-", "MIG-"))):
            break
        out.append(v)
    return out


#: Set in a GPU instance's worker when it narrows CUDA_VISIBLE_DEVICES to its own GPU
#: (``narrow_to``): the server GPU it runs on, and CUDA_VISIBLE_DEVICES as the server had
#: it (absent when unset), so that a tensor-parallel group can place its other ranks.
INSTANCE_GPU_ENV = "SHOAL_INSTANCE_GPU"
SERVER_VISIBLE_ENV = "SHOAL_SERVER_CUDA_VISIBLE_DEVICES"


def gpu_count(visible: str | None = None, present: int | None = None) -> int:
    """Visible NVIDIA GPUs (honouring CUDA_VISIBLE_DEVICES, or ``visible`` when given);
    0 without a driver. ``present``: the GPUs the driver shows (None: looked up)."""
    present = _present() if present is None else present
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if visible is None or present == 0:
        return present
    return min(len(visible_ids(visible)), present)


def narrow_to(gpu: int) -> None:
    """Show this process server GPU ``gpu`` alone (before any CUDA import), noting what
    it was shown before in ``INSTANCE_GPU_ENV`` and ``SERVER_VISIBLE_ENV``."""
    device = visible_device(gpu)
    if (before := os.environ.get("CUDA_VISIBLE_DEVICES")) is not None:
        os.environ[SERVER_VISIBLE_ENV] = before
    os.environ[INSTANCE_GPU_ENV] = str(gpu)
    os.environ["CUDA_VISIBLE_DEVICES"] = device


def group_devices(
    size: int, env: Mapping[str, str] | None = None, present: int | None = None
) -> list[str]:
    """The CUDA_VISIBLE_DEVICES of each rank of a tensor-parallel group of ``size`` whose
    rank 0 is this (narrowed) instance: server GPUs ``first``, ``first + 1``, ... wrapping
    around, one per rank. Raises ValueError when the server has fewer GPUs than ranks.
    ``env``: this process's environment (None: os.environ)."""
    env = os.environ if env is None else env
    if INSTANCE_GPU_ENV in env:
        first, visible = int(env[INSTANCE_GPU_ENV]), env.get(SERVER_VISIBLE_ENV)
    else:  # (not narrowed: a model run outside a worker)
        first, visible = 0, env.get("CUDA_VISIBLE_DEVICES")
    present = _present() if present is None else present
    count = present if visible is None else gpu_count(visible, present)
    if size > count:
        raise ValueError(
            f"tensor_parallel_size {size} needs {size} GPUs, one per rank; the server has {count}"
        )
    gpus = [(first + rank) % count for rank in range(size)]
    return [str(g) if visible is None else visible_device(g, visible) for g in gpus]


def visible_device(gpu: int, visible: str | None = None) -> str:
    """The CUDA_VISIBLE_DEVICES value that shows a process server GPU ``gpu`` alone (as its
    device 0): server GPU ids index the CUDA_VISIBLE_DEVICES the server was started with
    (``visible``; None: this process's)."""
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return str(gpu)
    ids = visible_ids(visible)
    if not 0 <= gpu < len(ids):
        raise ValueError(f"GPU {gpu} is not one of CUDA_VISIBLE_DEVICES={visible!r}")
    return ids[gpu]


# Backend name -> (package, a file of the package that only its GPU builds ship).
_GPU_BUILD_FILES: dict[str, tuple[str, tuple[str, ...]]] = {
    "onnxruntime": ("onnxruntime", ("capi", "libonnxruntime_providers_cuda.so")),
    "pytorch": ("torch", ("lib", "libtorch_cuda.so")),
}


#: Backends that shoal runs on the CPU whatever is installed (tree models: the CPU
#: builds of XGBoost, LightGBM and Treelite; OpenVINO, as Triton's backend: KIND_CPU only;
#: TensorFlow's CPU build).
_CPU_BACKENDS: frozenset[str] = frozenset({"fil", "openvino", "tensorflow", "identity"})


@functools.cache
def cpu_only_backends() -> frozenset[str]:
    """The backends whose installed runtime cannot use a GPU (onnxruntime without its
    CUDA execution provider, a CPU build of torch) or that shoal runs on the CPU only:
    for their models KIND_AUTO means KIND_CPU, as in a Triton built without GPU support.
    Read from the installed files, without importing the runtimes."""
    out = set(_CPU_BACKENDS)
    for backend, (package, parts) in _GPU_BUILD_FILES.items():
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        places = (spec.submodule_search_locations or []) if spec is not None else []
        if not any(Path(place, *parts).exists() for place in places):
            out.add(backend)
    return frozenset(out)
