#!/usr/bin/env bash
# Prints the library folders of the nvidia-* wheels in .venv (CUDA, cuDNN for
# onnxruntime-gpu), ':'-separated, for LD_LIBRARY_PATH; nothing where there are none.
# onnxruntime-gpu finds them by itself only through onnxruntime.preload_dlls(), which
# shoal's GPU workers call; the path is for anything that loads them otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python - <<'PYEOF'
import glob
import os
import site

dirs = []
for root in site.getsitepackages():
    dirs += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib")))
print(":".join(d for d in dirs if os.path.isdir(d)))
PYEOF
