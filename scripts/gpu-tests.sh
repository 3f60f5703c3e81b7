#!/usr/bin/env bash
# Run the GPU-marked tests (KIND_GPU instances, CUDA shared memory, GPU metrics) on a host
# with an NVIDIA GPU and its driver. Two modes:
#
# Networked (the default): set-up as scripts/setup.sh with the GPU extras it installs on
# a GPU host (scripts/gpu-extras.sh: onnxruntime-gpu, cupy, cuda-python; no CUDA toolkit
# needed).
#
# Offline (when .whl/ exists, or SHOAL_GPU_OFFLINE=1; SHOAL_GPU_OFFLINE=0 forces networked):
# for a machine with no package index whose python3 already holds torch, cupy,
# cuda-bindings, onnxruntime, numpy, aiohttp, uvloop, pytest... (this project's lent H200).
# No setup.sh, no .venv, no network: the wheels scripts/gpu-wheels.sh put in .whl/ go to
# /tmp/site (SHOAL_GPU_SITE), and PYTHONPATH is that plus the repo root (shoal's packages are
# plain folders there; the server's children inherit it). ONNX Runtime's CUDA execution
# provider is not required there (only reported): the image's onnxruntime is CPU-only, and
# the whole onnxruntime-gpu wheel is too large to carry; scripts/gpu-ort.sh makes one for a
# single GPU architecture, in parts (.ort/), unpacked here when all of them came along.
# Without it the tests that need the provider skip themselves.
#
# Before the tests: prints the versions in use, checks that shoal sees the GPU, that ONNX
# Runtime creates its CUDA execution provider (networked mode), that torch sees CUDA, and
# that cupy and the test client's CUDA shared memory work, each with a clear error; says
# whether TensorRT is there (the TensorRT tests need its builder, else they skip).
set -euo pipefail
cd "$(dirname "$0")/.."

offline=${SHOAL_GPU_OFFLINE:-}
if [ -z "$offline" ]; then
  if [ -d .whl ]; then offline=1; else offline=0; fi
fi

nvidia-smi -L
# What shoal.configs.devices counts: the driver's list, else the device files.
ls /proc/driver/nvidia/gpus /dev/nvidia* 2>&1 || true
export SHOAL_GPU_OFFLINE=$offline  # the preflight reads it

if [ "$offline" = 1 ]; then
  echo "gpu-tests: offline mode (no set-up, no package index)"
  PY=${PYTHON:-python3}
  site=${SHOAL_GPU_SITE:-/tmp/site}
  shopt -s nullglob
  wheels=(.whl/*.whl)
  shopt -u nullglob
  if [ "${#wheels[@]}" -gt 0 ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --disable-pip-version-check --target "$site" "${wheels[@]}"
    echo "gpu-tests: installed ${#wheels[@]} wheels from .whl/ into $site"
  else
    echo "gpu-tests: no wheels in .whl/ (run scripts/gpu-wheels.sh where there is network);" \
         "using what $PY has"
  fi
  # onnxruntime-gpu in parts (scripts/gpu-ort.sh), each brought by a call of its own: all
  # of them or none; else the image's CPU-only onnxruntime stays and those tests skip.
  parts=(.ort/onnxruntime-gpu.tar.xz.*)
  if [ -e "${parts[0]}" ]; then
    if [ -f .ort/onnxruntime-gpu.sha256 ] &&
       [ "$(cat "${parts[@]}" | sha256sum | cut -d ' ' -f 1)" = "$(cat .ort/onnxruntime-gpu.sha256)" ]; then
      rm -rf "$site/onnxruntime" "$site"/onnxruntime_gpu-*.dist-info
      mkdir -p "$site"
      cat "${parts[@]}" | "$PY" -c 'import sys, tarfile
tarfile.open(fileobj=sys.stdin.buffer, mode="r|xz").extractall(sys.argv[1], filter="tar")' "$site"
      echo "gpu-tests: onnxruntime-gpu unpacked into $site from ${#parts[@]} parts in .ort/"
    else
      echo "gpu-tests: warning: the parts in .ort/ (${parts[*]}) do not make the whole that" \
           ".ort/onnxruntime-gpu.sha256 names: a part is missing (the machine went back" \
           "between calls?); keeping the image's onnxruntime" >&2
    fi
  fi
  export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  # A machine with no package index fails here at once, not after pip's retries.
  probe=$(mktemp -d)
  if ! "${PYTHON:-python3}" -m pip download -q --no-deps --disable-pip-version-check \
      --retries 0 --timeout 10 --dest "$probe" msgspec >/dev/null 2>&1; then
    rm -rf "$probe"
    echo "gpu-tests: no package index reachable and no .whl/: run scripts/gpu-wheels.sh" \
         "where there is network and bring .whl/ along (offline mode)" >&2
    exit 2
  fi
  rm -rf "$probe"
  SHOAL_GPU=1 scripts/setup.sh  # with the GPU extras (scripts/gpu-extras.sh)
  PY=.venv/bin/python
  nvidia_libs=$(scripts/nvidia-libs.sh)  # the server's worker processes inherit this
  export LD_LIBRARY_PATH="${nvidia_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# The versions in use, and where grpc and protobuf come from (in offline mode the carried
# ones in the site folder must win over the image's).
"$PY" - <<'EOF'
import importlib
import importlib.metadata as md
import sys

print(f"python {sys.version.split()[0]} ({sys.executable})")
for dist, mod in (
    ("torch", "torch"),
    ("cupy-cuda13x", "cupy"),
    ("cupy-cuda12x", "cupy"),
    ("onnxruntime", "onnxruntime"),
    ("onnxruntime-gpu", "onnxruntime"),
    ("tensorrt", "tensorrt"),
    ("tensorrt-cu12", "tensorrt"),
    ("tensorrt-cu13", "tensorrt"),
    ("cuda-bindings", "cuda.bindings"),
    ("cuda-python", "cuda.bindings"),
    ("numpy", "numpy"),
    ("grpcio", "grpc"),
    ("protobuf", "google.protobuf"),
    ("grpcio-health-checking", "grpc_health"),
    ("tritonclient", "tritonclient"),
):
    try:
        version = md.version(dist)
    except md.PackageNotFoundError:
        continue
    try:
        module = importlib.import_module(mod)
    except Exception as e:  # reported here; the preflight below fails clearly
        print(f"{dist} {version} (IMPORT FAILED: {type(e).__name__}: {e})")
        continue
    print(f"{dist} {version} ({module.__file__})")
    imported = getattr(module, "__version__", version)
    if dist in ("grpcio", "protobuf") and imported != version:
        sys.exit(f"{dist} {imported} is imported but {version} is the one first on "
                 "sys.path: another copy shadows it")
EOF

# The preflight's verdict on ONNX Runtime's CUDA provider goes to the tests (which would
# otherwise read only the provider list, fixed when onnxruntime was built).
ort_verdict=$(mktemp)
export SHOAL_ORT_VERDICT_FILE=$ort_verdict
"$PY" - <<'EOF'
import os
import sys
import tempfile
from pathlib import Path

import cupy
import numpy as np
import onnxruntime as ort
import tritonclient.utils.cuda_shared_memory as cudashm

from shoal.configs.devices import gpu_count
from tools import modelgen

# Networked, onnxruntime-gpu was installed above and must work; offline (CPU-only
# onnxruntime) the ONNX Runtime GPU tests skip themselves.
offline = os.environ.get("SHOAL_GPU_OFFLINE") == "1"
require_ort_cuda = not offline
n = gpu_count()
print(f"preflight: shoal sees {n} GPU(s)")
if n == 0:
    sys.exit("preflight: shoal.configs.devices finds no GPU (neither /proc/driver/nvidia/gpus "
             "nor /dev/nvidia<N>): every KIND_GPU model would fail to load")
available = ort.get_available_providers()
ort_cuda = False
if "CUDAExecutionProvider" not in available:
    if require_ort_cuda:
        sys.exit(f"preflight: onnxruntime {ort.__version__} has no CUDA execution provider")
    print(f"preflight: onnxruntime {ort.__version__} has no CUDA execution provider "
          f"({available}): the ONNX Runtime GPU tests will skip")
else:
    if hasattr(ort, "preload_dlls"):  # as shoal's GPU workers do: CUDA, cuDNN from nvidia-*
        ort.preload_dlls()
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "identity.onnx"
        model.write_bytes(modelgen.identity_model("FP32", [-1], batch=True))
        sess = ort.InferenceSession(
            str(model), providers=["CUDAExecutionProvider", "CPUExecutionProvider"]
        )
        print(f"preflight: onnxruntime {ort.__version__} (CUDA {ort.cuda_version}):",
              sess.get_providers())
        ort_cuda = "CUDAExecutionProvider" in sess.get_providers()
        if not ort_cuda:
            msg = ("onnxruntime-gpu could not create its CUDA execution provider "
                   "(its CUDA/cuDNN libraries did not load; see the messages above): the "
                   "ONNX Runtime GPU tests will skip")
            if require_ort_cuda:
                sys.exit(f"preflight: {msg}")
            print(f"preflight: warning: {msg}")
Path(os.environ["SHOAL_ORT_VERDICT_FILE"]).write_text("1" if ort_cuda else "0")
# TensorRT plans (tests/gpu/test_tensorrt.py) need TensorRT's builder to make their engines
# (tools/trtgen.py: the module tensorrt, or tensorrt_bindings as PyPI's bindings wheel names it).
try:
    from tools import trtgen
    print(f"preflight: TensorRT {trtgen.trt.__version__}: the TensorRT tests build engines")
except Exception as exc:  # not installed, or its libraries do not load
    print(f"preflight: no TensorRT builder here ({type(exc).__name__}: {exc}): the TensorRT "
          "tests will skip. Its libraries (tensorrt-cu13-libs) have no wheel on PyPI (an "
          "sdist that downloads from NVIDIA's index), so they cannot be carried; PyPI's "
          "lean runtime (tensorrt-lean-cu13-libs, 44 MB) runs plans but builds none. A "
          "host whose image has TensorRT runs them")
# The TorchScript tests run KIND_GPU instances on torch: it must be a CUDA build.
fix = ("the image's python3 should hold it" if offline else
       "install a CUDA build of torch into .venv (scripts/setup.sh takes SHOAL_TORCH)")
try:
    import torch
except ImportError:
    sys.exit(f"preflight: torch is not installed: {fix}")
if not torch.cuda.is_available():
    sys.exit(f"preflight: torch {torch.__version__} does not see CUDA "
             f"(built for CUDA {torch.version.cuda}): {fix}")
y = torch.arange(8, dtype=torch.float32, device="cuda") * 2
assert float(y.sum()) == 56.0
print(f"preflight: torch {torch.__version__} (CUDA {torch.version.cuda}) works on "
      f"{torch.cuda.get_device_name(0)}")
# A copy to the device and back first (cupy.arange would launch a compiled kernel):
# all shoal's GPU paths need.
x = cupy.asarray(np.arange(8, dtype=np.float32))
assert cupy.asnumpy(x).tolist() == list(range(8))
print(f"preflight: cupy {cupy.__version__} (CUDA runtime "
      f"{cupy.cuda.runtime.runtimeGetVersion()}) works")
try:
    assert float((x * 2).sum()) == 56.0  # a compiled kernel: NVRTC
except Exception as exc:  # shoal's GPU paths compile no kernel: report, carry on
    print(f"preflight: warning: cupy cannot compile kernels ({exc})")
h = cudashm.create_shared_memory_region("preflight", 64, 0)
try:
    handle = cudashm.get_raw_handle(h)
    # base64 of a 64-byte cudaIpcMemHandle_t
    assert len(handle) == 88, f"raw handle is {len(handle)} characters, not 88"
finally:
    cudashm.destroy_shared_memory_region(h)
print("preflight: tritonclient CUDA shared memory works")
EOF

SHOAL_TEST_ORT_CUDA=$(cat "$ort_verdict")
rm -f "$ort_verdict"
export SHOAL_TEST_ORT_CUDA
# All of tests/gpu in one go. A device call ends at 10 minutes: pytest is interrupted
# before that (SHOAL_GPU_PYTEST_S, default 480 s) so that it still prints what passed and
# what did not (SIGINT: its summary; each test has its own timeout too, pyproject.toml).
set +e
timeout -s INT -k 30 "${SHOAL_GPU_PYTEST_S:-480}" \
  "$PY" -m pytest -q -rfEs -m gpu -o addopts="" -p no:cacheprovider tests/gpu "$@"
rc=$?
set -e
[ "$rc" -eq 124 ] && echo "gpu-tests: pytest interrupted after ${SHOAL_GPU_PYTEST_S:-480} s" >&2
[ "$rc" -eq 5 ] && { echo "no GPU tests collected"; exit 1; }
exit "$rc"
