"""The accelerators this host has, found without importing CUDA (so that the frontend
and broker stay free of it, and no CUDA context is created before workers fork)."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
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


def gpu_count() -> int:
    """Visible NVIDIA GPUs (honouring CUDA_VISIBLE_DEVICES); 0 without a driver."""
    present = _present()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or present == 0:
        return present
    return min(len(visible_ids(visible)), present)


def visible_device(gpu: int) -> str:
    """The CUDA_VISIBLE_DEVICES value that shows a process server GPU ``gpu`` alone (as its
    device 0): server GPU ids index the CUDA_VISIBLE_DEVICES the server was started with."""
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
