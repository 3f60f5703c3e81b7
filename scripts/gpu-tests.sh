#!/usr/bin/env bash
# Run the GPU-marked tests (KIND_GPU instances, CUDA shared memory) on a host with an
# NVIDIA GPU and its driver (no CUDA toolkit needed). Set-up as scripts/setup.sh, then the
# GPU extras into the same .venv:
# - onnxruntime-gpu in place of onnxruntime (both install the same `onnxruntime` package,
#   so the CPU one must not stay next to it), with its [cuda,cudnn] extras: the CUDA and
#   cuDNN libraries it was built against, as nvidia-* wheels;
# - cupy for the same CUDA major as onnxruntime-gpu (both live in a GPU worker), with
#   [ctk]: the CUDA toolkit pieces it needs at run time (NVRTC) from PyPI;
# - cuda-python, which tritonclient's CUDA shared-memory utilities (the test client) use
#   as `cuda.bindings.runtime`; below 13 because tritonclient releases before the
#   cuda-bindings 13 fix read the handle through `cudaIpcMemHandle_t.reserved`, which 13
#   dropped. 12.x bindings work with newer drivers.
# Before the tests: checks that shoal sees the GPU, that ONNX Runtime really creates its
# CUDA execution provider, and that cupy and the test client work, each with a clear error.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
nvidia-smi -L
PY=.venv/bin/python

gpu_extras_ok() {
  "$PY" - <<'EOF'
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
EOF
}

if ! gpu_extras_ok 2>/dev/null; then
  "$PY" -m pip uninstall -y -q onnxruntime onnxruntime-gpu || true
  "$PY" -m pip install -q 'onnxruntime-gpu[cuda,cudnn]'
  major=$("$PY" -c 'import onnxruntime as o; print((o.cuda_version or "12").split(".")[0])')
  "$PY" -m pip install -q "cupy-cuda${major}x[ctk]" 'cuda-python<13'
  gpu_extras_ok
fi

# onnxruntime-gpu finds the CUDA/cuDNN wheels only when told where they are (it does not
# look in site-packages by itself unless onnxruntime.preload_dlls() is called); the
# server's worker processes inherit this.
nvidia_libs=$("$PY" - <<'EOF'
import glob
import os
import site

dirs = []
for root in site.getsitepackages():
    dirs += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib")))
print(":".join(d for d in dirs if os.path.isdir(d)))
EOF
)
export LD_LIBRARY_PATH="${nvidia_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

"$PY" - <<'EOF'
import sys
import tempfile
from pathlib import Path

import cupy
import onnxruntime as ort
import tritonclient.utils.cuda_shared_memory as cudashm

from configs.devices import gpu_count
from shoal import modelgen

n = gpu_count()
print(f"preflight: shoal sees {n} GPU(s)")
if n == 0:
    sys.exit("preflight: configs.devices finds no GPU (/proc/driver/nvidia/gpus): "
             "every KIND_GPU model would fail to load")
with tempfile.TemporaryDirectory() as tmp:
    model = Path(tmp) / "identity.onnx"
    model.write_bytes(modelgen.identity_model("FP32", [-1], batch=True))
    sess = ort.InferenceSession(
        str(model), providers=["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    print(f"preflight: onnxruntime {ort.__version__} (CUDA {ort.cuda_version}):",
          sess.get_providers())
    if "CUDAExecutionProvider" not in sess.get_providers():
        sys.exit("preflight: onnxruntime-gpu could not create its CUDA execution provider "
                 "(its CUDA/cuDNN libraries did not load; see the messages above)")
x = cupy.arange(8, dtype=cupy.float32)
assert float((x * 2).sum()) == 56.0  # a compiled kernel: NVRTC works
print(f"preflight: cupy {cupy.__version__} (CUDA runtime "
      f"{cupy.cuda.runtime.runtimeGetVersion()}) works")
h = cudashm.create_shared_memory_region("preflight", 64, 0)
try:
    assert len(cudashm.get_raw_handle(h)) == 88  # base64 of a 64-byte cudaIpcMemHandle_t
finally:
    cudashm.destroy_shared_memory_region(h)
print("preflight: tritonclient CUDA shared memory works")
EOF

set +e
"$PY" -m pytest -q -m gpu -o addopts="" tests/gpu "$@"
rc=$?
set -e
[ "$rc" -eq 5 ] && { echo "no GPU tests collected"; exit 1; }
exit "$rc"
