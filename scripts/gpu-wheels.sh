#!/usr/bin/env bash
# Run where there is network, before scripts/gpu-tests.sh on a GPU machine that has none
# (this project's lent H200: Python 3.12 with torch, cupy-cuda13x, cuda-bindings 13,
# onnxruntime (CPU), onnx, aiohttp, uvloop, numpy, pytest... preinstalled, no PyPI).
# Downloads into .whl/ (git-ignored) the cp312 manylinux x86_64 wheels of what shoal and its
# GPU tests need that such an image lacks, one pinned version of each, --no-deps: every
# dependency is named below. gpu-tests.sh installs them with --target /tmp/site and puts
# that first on PYTHONPATH, so these versions win over any the image has.
# - grpcio and protobuf are carried although the image has both: shoal needs grpcio>=1.81
#   (grpcio-health-checking's and tritonclient's generated stubs refuse an older grpcio), and
#   tritonclient and grpcio-health-checking 1.81 need protobuf 6 (<7), while a late-2026
#   image may hold protobuf 7. Carrying them makes the device match the tested .venv.
# - grpcio-health-checking stays at 1.81.x: 1.82+ needs protobuf 7.
# - greenlet stays below 3.4 (tritonclient[http] says so).
# Then checks every wheel's Requires-Dist against the carried set plus what the image is
# known to hold, and the total size against the 64 MiB a device call can carry.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(
  tritonclient==2.73.0
  grpcio==1.85.3
  protobuf==6.33.6
  grpcio-health-checking==1.81.1
  pyzmq==27.3.0
  msgspec==0.23.0
  python-rapidjson==1.25
  geventhttpclient==2.6.1
  gevent==26.9.0
  greenlet==3.3.2
  zope.event==6.2
  zope.interface==8.7
  brotli==1.2.1
)
# What the device image holds that these wheels or shoal need (see the device's KINDS.md).
DEVICE_HAS="aiohttp certifi cuda-bindings cupy-cuda13x ml-dtypes numpy nvidia-ml-py onnx
onnxruntime packaging prometheus-client pytest pytest-timeout setuptools torch
typing-extensions urllib3 uvloop"
LIMIT_MIB=56

PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python

platforms=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64
           --platform manylinux1_x86_64)
for n in $(seq 5 39); do platforms+=(--platform "manylinux_2_${n}_x86_64"); done

mkdir -p .whl
rm -f .whl/*.whl  # one version of each: a stale second version would stop the install
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d .whl "${WHEELS[@]}" 2>&1 |
  { grep -v 'is ignored: it is neither a file nor a directory' || true; }

DEVICE_HAS="$DEVICE_HAS" "$PY" - "${WHEELS[@]}" <<'EOF'
import os
import re
import sys
import tomllib
import zipfile
from pathlib import Path

try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


pins = {canon(s.split("==")[0]): s.split("==")[1] for s in sys.argv[1:]}
device = {canon(n) for n in os.environ["DEVICE_HAS"].split()}
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython"}
wheels = sorted(Path(".whl").glob("*.whl"))
errors = []
got: dict[str, str] = {}
needs: list[tuple[str, Requirement]] = []
for w in wheels:
    with zipfile.ZipFile(w) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    name = canon(re.search(r"^Name: (.+)$", text, re.M).group(1).strip())
    version = re.search(r"^Version: (.+)$", text, re.M).group(1).strip()
    if name in got:
        errors.append(f"two versions of {name} in .whl/")
    got[name] = version
    extras = ["http", "grpc"] if name == "tritonclient" else [""]
    for line in re.findall(r"^Requires-Dist: (.+)$", text, re.M):
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in extras):
            needs.append((name, req))
# shoal's own run-time dependencies (the dev extra adds tritonclient[http], onnx, ml_dtypes,
# pytest and pytest-timeout for the tests: all above or on the image).
project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
needs += [("shoal", Requirement(d)) for d in project["dependencies"]]
for name in pins:
    if name not in got:
        errors.append(f"{name}=={pins[name]} was not downloaded")
for who, req in needs:
    dep = canon(req.name)
    if dep in got:
        if not req.specifier.contains(got[dep], prereleases=True):
            errors.append(f"{who} needs {req}, .whl/ has {dep} {got[dep]}")
    elif dep not in device:
        errors.append(f"{who} needs {req}: neither in .whl/ nor on the device image")
for w in wheels:
    print(f"  {w.stat().st_size / 2**20:6.2f} MiB  {w.name}")
if errors:
    sys.exit("gpu-wheels: " + "\n  ".join(["dependency check failed:", *errors]))
EOF

bytes=$(du -cb .whl/*.whl | tail -n 1 | cut -f 1)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "gpu-wheels: $(find .whl -type f -name '*.whl' | wc -l) wheels, ${mib} MiB in .whl/"
if [ "$bytes" -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "gpu-wheels: error: over ${LIMIT_MIB} MiB; a device call carries at most 64 MiB with" \
       "the rest of the working tree" >&2
  exit 1
fi
