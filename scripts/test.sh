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
# Unit and integration tests in two processes (pytest-xdist; a file's tests stay together,
# sharing its servers; the slowest files first, in tests/conftest.py's order); the fault
# tests, which kill processes and time recoveries, and the tests that compare measurements
# (tests/measured), alone.
status=0
.venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder \
  tests/unit tests/integration "$@" || status=$?
.venv/bin/python -m pytest -q tests/fault tests/measured "$@" || status=$?
exit "$status"
