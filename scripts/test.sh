#!/usr/bin/env bash
# Set up (if needed) and run the whole suite: lint, format check, type check, then every
# test (unit, integration with real server processes, fault). GPU-marked tests are
# skipped here; scripts/gpu-tests.sh runs them on a GPU host.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Types are checked beside the first test phase (mypy is one process; the tests leave some
# of the two cores idle): its verdict is printed, and counted, after that phase.
types_log=$(mktemp)
.venv/bin/mypy >"$types_log" 2>&1 &
types=$!
# Unit, integration and fault tests in three processes (pytest-xdist; a file's tests stay
# together, sharing its servers; the slowest files first, in tests/conftest.py's order):
# most fault tests wait on timeouts more than they compute, so a third process fills the
# two cores. Then, alone, the tests marked serial: those that need a /dev/shm no other
# server sweeps, and those that compare measurements (tests/measured).
status=0
.venv/bin/python -m pytest -q -n "${SHOAL_TEST_PROCESSES:-3}" --dist loadfile \
  --no-loadscope-reorder -m "not gpu and not container and not serial" \
  tests/unit tests/integration tests/fault "$@" || status=$?
wait "$types" || status=$?
cat "$types_log"
rm -f "$types_log"
.venv/bin/python -m pytest -q -m "serial and not gpu and not container" \
  tests/fault tests/measured "$@" || status=$?
exit "$status"
