#!/usr/bin/env bash
# The GPU extras in .venv, for a host with an NVIDIA GPU (scripts/setup.sh runs this there;
# it needs the package index). Idempotent: checks first, installs only what is missing.
# - onnxruntime-gpu in place of onnxruntime (both install the same `onnxruntime` package,
#   so the CPU one must not stay next to it; `pip install -e .` puts it back, which is why
#   this runs after every set-up), with its [cuda,cudnn] extras: the CUDA and cuDNN
#   libraries it was built against, as nvidia-* wheels;
# - cupy for the same CUDA major as onnxruntime-gpu (both live in a GPU worker), with
#   [ctk]: the CUDA toolkit pieces it needs at run time (NVRTC) from PyPI;
# - cuda-bindings of that same CUDA major, which tritonclient's CUDA shared-memory
#   utilities (clients, and the GPU tests) use as `cuda.bindings.runtime`. tritonclient
#   2.73 (the dev extra's floor) reads the IPC handle through getPtr(), so 13.x works; a
#   torch built for CUDA 13 pins cuda-bindings 13 itself, and a 12.x pin here would pull
#   it from under torch. onnxruntime-gpu 1.31 on PyPI is built for CUDA 13.
# torch comes from scripts/setup.sh (SHOAL_TORCH): on such a host PyPI's torch is a CUDA
# build already. A torch built for another CUDA major than onnxruntime-gpu is reported:
# one GPU worker would load two CUDA runtimes and two cuDNNs (whose wheels share a folder).
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
bindings = md.version("cuda-bindings").split(".")[0]
assert bindings == major, f"cuda-bindings {bindings}.x next to CUDA {major} libraries"
PYEOF
}

torch_cuda_check() {
  "$PY" - <<'PYEOF'
import onnxruntime as ort
import torch

ort_major = (ort.cuda_version or "").split(".")[0]
torch_major = (torch.version.cuda or "").split(".")[0]
if torch_major and ort_major and torch_major != ort_major:
    print(f"warning: torch {torch.__version__} is built for CUDA {torch.version.cuda} and "
          f"onnxruntime-gpu {ort.__version__} for CUDA {ort.cuda_version}: install a torch "
          f"for CUDA {ort_major} (SHOAL_TORCH) so that a GPU worker loads one CUDA runtime")
PYEOF
}

if gpu_extras_ok 2>/dev/null; then
  torch_cuda_check
  exit 0
fi
log=.venv/gpu-extras.log
echo "setting up the GPU extras (onnxruntime-gpu, cupy); log in $log" >&2
if ! {
  "$PY" -m pip uninstall -y onnxruntime onnxruntime-gpu || true
  "$PY" -m pip install 'onnxruntime-gpu[cuda,cudnn]' &&
  major=$("$PY" -c 'import onnxruntime as o; print((o.cuda_version or "12").split(".")[0])') &&
  "$PY" -m pip install "cupy-cuda${major}x[ctk]" "cuda-bindings>=${major},<$((major + 1))"
} >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "GPU extras set-up failed; full log in $log" >&2
  exit 1
fi
gpu_extras_ok
torch_cuda_check
