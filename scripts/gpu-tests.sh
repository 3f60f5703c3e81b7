#!/usr/bin/env bash
# Run the GPU-marked tests (KIND_GPU instances, CUDA shared memory) on a host with an
# NVIDIA GPU. Set-up as scripts/setup.sh, then the GPU extras into the same .venv:
# onnxruntime-gpu in place of onnxruntime, cupy and cuda-python (tritonclient's CUDA
# shared-memory utilities use it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
nvidia-smi -L
if ! .venv/bin/python -c 'import cupy, cuda; import onnxruntime as o; assert "CUDAExecutionProvider" in o.get_available_providers()' 2>/dev/null; then
  .venv/bin/python -m pip uninstall -y -q onnxruntime || true
  .venv/bin/python -m pip install -q onnxruntime-gpu cupy-cuda12x 'cuda-python<13'
fi
set +e
.venv/bin/python -m pytest -q -m gpu -o addopts="" tests/gpu "$@"
rc=$?
set -e
[ "$rc" -eq 5 ] && { echo "no GPU tests collected"; exit 1; }
exit "$rc"
