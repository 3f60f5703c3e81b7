#!/usr/bin/env bash
# Run where there is network, for a GPU machine that has none and whose onnxruntime is
# CPU-only (this project's lent H200): builds onnxruntime-gpu for one GPU architecture,
# in parts small enough to carry, so that scripts/gpu-tests.sh can run the ONNX Runtime
# KIND_GPU and CUDA-shared-memory tests there too.
#
# The onnxruntime-gpu wheel (CUDA 13; it finds CUDA and cuDNN in the nvidia-* wheels that
# torch brings, through onnxruntime.preload_dlls()) is 244 MiB, most of it GPU code for
# seven architectures. This keeps the onnxruntime package alone, without the C library and
# the TensorRT provider that the Python module does not load, and in every fat binary of
# the CUDA provider zeroes the code for other architectures than SHOAL_GPU_SM (90: Hopper;
# PTX for that architecture or an older one is kept, as the driver can compile it), which
# then compresses to nothing. Out: .ort/onnxruntime-gpu.tar.xz.00, .01, ... of at most
# SHOAL_ORT_PART_MIB (40) each, and .ort/onnxruntime-gpu.sha256 of the whole. Each part
# goes to the GPU machine with a call of its own (carry: [".ort/onnxruntime-gpu.tar.xz.00"],
# and so on), the last with the .sha256 file: a warm machine keeps what earlier calls left.
# gpu-tests.sh joins and checks them and unpacks the package in front of the image's.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${SHOAL_ORT_VERSION:-1.31.1}
SM=${SHOAL_GPU_SM:-90}
PART_MIB=${SHOAL_ORT_PART_MIB:-40}
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$work" "onnxruntime-gpu==$VERSION" 2>&1 |
  { grep -v 'is ignored: it is neither a file nor a directory' || true; }
mkdir "$work/site"
"$PY" - "$work"/onnxruntime_gpu-*.whl "$work/site" "$SM" <<'EOF'
import collections
import struct
import sys
import zipfile
from pathlib import Path

wheel, site, sm = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        base = name.rsplit("/", 1)[-1]
        if base.startswith(("libonnxruntime.so", "libonnxruntime_providers_tensorrt")):
            continue  # the C library, the TensorRT provider: the Python module loads neither
        z.extract(name, site)

# A fat binary (NVIDIA's .nv_fatbin containers): a 16-byte header (magic, version 1,
# header size 16, size of what follows), then entries, each a header (kind 1 PTX or 2 ELF,
# header size at 4, payload size at 8, architecture at 28) and its payload.
MAGIC = struct.pack("<I", 0xBA55ED50)
lib = site / "onnxruntime" / "capi" / "libonnxruntime_providers_cuda.so"
data = bytearray(lib.read_bytes())
kept: collections.Counter[str] = collections.Counter()
dropped: collections.Counter[str] = collections.Counter()
pos = containers = 0
while (pos := data.find(MAGIC, pos)) >= 0:
    _, version, header, size = struct.unpack_from("<IHHQ", data, pos)
    end = pos + 16 + size
    if version != 1 or header != 16 or end > len(data):
        pos += 4
        continue
    entries = []
    at = pos + 16
    while at < end:
        kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, at)
        (arch,) = struct.unpack_from("<I", data, at + 28)
        if kind not in (1, 2) or entry_header < 64 or at + entry_header + payload > end:
            break
        entries.append((kind, arch, at + entry_header, payload))
        at += entry_header + payload
    if at != end:  # not a container after all: the magic number inside other bytes
        pos += 4
        continue
    containers += 1
    for kind, arch, start, payload in entries:
        label = f"{'ptx' if kind == 1 else 'sm'}_{arch}"
        if (kind == 2 and arch != sm) or (kind == 1 and arch > sm):
            data[start : start + payload] = bytes(payload)
            dropped[label] += payload
        else:
            kept[label] += payload
    pos = end
if not kept:
    sys.exit(f"gpu-ort: no code for sm_{sm} in {lib.name}")
lib.write_bytes(data)


def mib(c: collections.Counter[str]) -> str:
    return ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in sorted(c.items()))


print(f"gpu-ort: {containers} fat binaries; kept {mib(kept)}; zeroed {mib(dropped)}")
EOF

mkdir -p .ort
rm -f .ort/onnxruntime-gpu.*
XZ_OPT="-6 -T0" tar -C "$work/site" -cJf "$work/onnxruntime-gpu.tar.xz" .
(cd "$work" && sha256sum onnxruntime-gpu.tar.xz) | cut -d ' ' -f 1 > .ort/onnxruntime-gpu.sha256
split -a 2 -d -b "${PART_MIB}M" "$work/onnxruntime-gpu.tar.xz" .ort/onnxruntime-gpu.tar.xz.
ls -l .ort
