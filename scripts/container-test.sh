#!/usr/bin/env bash
# Build the CPU container image and serve requests from a container of it (the tests
# marked `container`, which scripts/test.sh leaves out: the build takes minutes). Needs
# podman; where the Dockerfile's base image cannot be pulled, mmdebstrap builds one from
# Debian's packages (cached in ~/.cache/shoal-tests). Skips, saying why, where neither
# can be had. Prints the build's time and the image's size.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/python -m pytest -q -rPs -m container -o addopts="" -p no:cacheprovider \
  tests/integration/test_container_image.py "$@"
