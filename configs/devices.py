"""The accelerators this host has, found without importing CUDA (so that the frontend
and broker stay free of it, and no CUDA context is created before workers fork)."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

_NVIDIA_PROC = Path("/proc/driver/nvidia/gpus")


def gpu_count() -> int:
    """Visible NVIDIA GPUs (honouring CUDA_VISIBLE_DEVICES); 0 without a driver."""
    try:
        present = sum(1 for _ in _NVIDIA_PROC.iterdir())
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    ids = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
    return min(len(ids), present)


def visible_device(gpu: int) -> str:
    """The CUDA_VISIBLE_DEVICES value that shows a process server GPU ``gpu`` alone (as its
    device 0): server GPU ids index the CUDA_VISIBLE_DEVICES the server was started with."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return str(gpu)
    ids = [v.strip() for v in visible.split(",") if v.strip() and v.strip() != "-1"]
    if not 0 <= gpu < len(ids):
        raise ValueError(f"GPU {gpu} is not one of CUDA_VISIBLE_DEVICES={visible!r}")
    return ids[gpu]


# Backend name -> (package, a file of the package that only its GPU builds ship).
_GPU_BUILD_FILES: dict[str, tuple[str, tuple[str, ...]]] = {
    "onnxruntime": ("onnxruntime", ("capi", "libonnxruntime_providers_cuda.so")),
    "pytorch": ("torch", ("lib", "libtorch_cuda.so")),
}


@functools.cache
def cpu_only_backends() -> frozenset[str]:
    """The backends whose installed runtime cannot use a GPU (onnxruntime without its
    CUDA execution provider, a CPU build of torch): for their models KIND_AUTO means
    KIND_CPU, as in a Triton built without GPU support. Read from the installed files,
    without importing the runtimes."""
    out = set()
    for backend, (package, parts) in _GPU_BUILD_FILES.items():
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        places = (spec.submodule_search_locations or []) if spec is not None else []
        if not any(Path(place, *parts).exists() for place in places):
            out.add(backend)
    return frozenset(out)
