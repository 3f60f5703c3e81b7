#!/usr/bin/env bash
# The GPU extras in .venv, for a host with an NVIDIA GPU (scripts/setup.sh runs this there;
# it needs the package index). Idempotent: checks first, installs only what is missing.
# - onnxruntime-gpu in place of onnxruntime (both install the same `onnxruntime` package,
#   so the CPU one must not stay next to it; `pip install -e .` puts it back, which is why
#   this runs after every set-up), with its [cuda,cudnn] extras: the CUDA and cuDNN
#   libraries it was built against, as nvidia-* wheels;
# - cupy for the same CUDA major as onnxruntime-gpu (both live in a GPU worker), with
#   [ctk]: the CUDA toolkit pieces it needs at run time (NVRTC) from PyPI;
# - cuda-python, which tritonclient's CUDA shared-memory utilities (clients, and the GPU
#   tests) use as `cuda.bindings.runtime`; below 13 because tritonclient releases before
#   the cuda-bindings 13 fix read the handle through `cudaIpcMemHandle_t.reserved`, which
#   13 dropped. 12.x bindings work with newer drivers.
# torch comes from scripts/setup.sh (SHOAL_TORCH): on such a host PyPI's torch is a CUDA
# build already.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python

gpu_extras_ok() {
  "$PY" - <<'PYEOF'
import importlib.metadata as md
import sys

import cuda.bindings.runtime  # noqa: F401
import cupy  # noqa: F401
import onnxruntime as ort
import tritonclient.utils.cuda_shared_memory  # noqa: F401

try:
    md.version("onnxruntime")
    sys.exit("the CPU onnxruntime package is installed over onnxruntime-gpu")
except md.PackageNotFoundError:
    pass
assert "CUDAExecutionProvider" in ort.get_available_providers()
major = (ort.cuda_version or "12").split(".")[0]
md.version(f"cupy-cuda{major}x")  # cupy for the CUDA major onnxruntime-gpu was built for
PYEOF
}

if gpu_extras_ok 2>/dev/null; then
  exit 0
fi
log=.venv/gpu-extras.log
echo "setting up the GPU extras (onnxruntime-gpu, cupy); log in $log" >&2
if ! {
  "$PY" -m pip uninstall -y onnxruntime onnxruntime-gpu || true
  "$PY" -m pip install 'onnxruntime-gpu[cuda,cudnn]' &&
  major=$("$PY" -c 'import onnxruntime as o; print((o.cuda_version or "12").split(".")[0])') &&
  "$PY" -m pip install "cupy-cuda${major}x[ctk]" 'cuda-python<13'
} >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "GPU extras set-up failed; full log in $log" >&2
  exit 1
fi
gpu_extras_ok
