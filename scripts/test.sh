#!/usr/bin/env bash
# Set up (if needed) and run the whole suite: lint, format check, type check, then every
# test (unit, integration with real server processes, fault). GPU-marked tests are
# skipped here; scripts/gpu-tests.sh runs them on a GPU host.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/python -m pytest -q "$@"
