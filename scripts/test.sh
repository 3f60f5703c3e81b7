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
# Unit, integration and fault tests in three processes (pytest-xdist; a file's tests stay
# together, sharing its servers; the slowest files first, in tests/conftest.py's order):
# most fault tests wait on timeouts more than they compute, so a third process fills the
# two cores. Then, alone, the tests marked serial: those that need a /dev/shm no other
# server sweeps, and those that compare measurements (tests/measured).
status=0
.venv/bin/python -m pytest -q -n "${SHOAL_TEST_PROCESSES:-3}" --dist loadfile \
  --no-loadscope-reorder -m "not gpu and not container and not serial" \
  tests/unit tests/integration tests/fault "$@" || status=$?
.venv/bin/python -m pytest -q -m "serial and not gpu and not container" \
  tests/fault tests/measured "$@" || status=$?
exit "$status"
