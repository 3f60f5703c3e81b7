#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: a virtual environment in .venv with shoal and its
# test tools installed (editable). Re-running it only installs what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.shoal-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  log=.venv/pip-install.log
  # torch first, pinned: a bare torch requirement would pull a multi-GB CUDA build where a
  # CPU one is at hand (SHOAL_TORCH picks another, e.g. a CUDA build on a GPU host).
  if ! { .venv/bin/python -m pip install --upgrade pip &&
         .venv/bin/python -m pip install "${SHOAL_TORCH:-torch==2.13.0}" &&
         .venv/bin/python -m pip install -e '.[dev,fil,openvino,tensorflow]'; } >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "set-up failed; full log in $log" >&2
    exit 1
  fi
  touch "$stamp"
fi
# Azurite, Azure Blob Storage's emulator, for the az:// repository tests: an npm package,
# installed in the venv where Node.js is (those tests skip, saying why, where it is not).
# 3.35.0: the last release that runs on Node.js 20 (3.36 asks for 21, 3.37 for 22).
AZURITE=3.35.0
if [ "$(cat .venv/azurite/.installed 2>/dev/null)" != "$AZURITE" ]; then
  if command -v npm >/dev/null 2>&1; then
    log=.venv/azurite-install.log
    if ! npm install --prefix .venv/azurite --no-audit --no-fund --loglevel=error \
         "azurite@$AZURITE" >"$log" 2>&1; then
      tail -n 40 "$log" >&2
      echo "set-up failed (azurite, from npm); full log in $log" >&2
      exit 1
    fi
    echo "$AZURITE" >.venv/azurite/.installed
  else
    echo "note: no npm here: the az:// repository tests will skip (Azurite needs Node.js)" >&2
  fi
fi
# On a host with an NVIDIA GPU (SHOAL_GPU=auto, the default; 1 forces, 0 skips) the GPU
# extras too: onnxruntime-gpu in place of onnxruntime, cupy (scripts/gpu-extras.sh).
gpu=${SHOAL_GPU:-auto}
if [ "$gpu" = auto ]; then
  # What shoal.configs.devices counts: the driver's list of GPUs.
  if [ -n "$(ls -A /proc/driver/nvidia/gpus 2>/dev/null)" ]; then gpu=1; else gpu=0; fi
fi
if [ "$gpu" = 1 ]; then
  scripts/gpu-extras.sh
fi
# Model files too large to commit (mlp_large's weights) are generated once, deterministically.
if [ ! -f model_repository/mlp_large/1/model.onnx ]; then
  .venv/bin/python -m tools.modelgen --missing-only >/dev/null
fi
