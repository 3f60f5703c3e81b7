#!/usr/bin/env bash
# Run the GPU-marked tests (CUDA shared memory, TensorRT, KIND_GPU instances) on a host
# with an NVIDIA GPU. Set-up as scripts/setup.sh, plus the GPU extras when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
nvidia-smi -L
set +e
.venv/bin/python -m pytest -q -m gpu -o addopts="" "$@"
rc=$?
set -e
[ "$rc" -eq 5 ] && { echo "no GPU tests collected"; exit 0; }
exit "$rc"
