"""The accelerators this host has, found without importing CUDA (so that the frontend
and broker stay free of it, and no CUDA context is created before workers fork)."""

from __future__ import annotations

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
