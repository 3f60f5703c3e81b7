#!/usr/bin/env bash
# Set up (if needed) and serve the shipped model_repository/ on :8000 (HTTP).
# Extra arguments go to `shoal serve`, e.g. scripts/serve.sh --http-port=9000
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
nvidia_libs=$(scripts/nvidia-libs.sh)  # a GPU host's CUDA and cuDNN wheels, if any
if [ -n "$nvidia_libs" ]; then
  export LD_LIBRARY_PATH="${nvidia_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
exec .venv/bin/shoal serve --model-repository model_repository "$@"
