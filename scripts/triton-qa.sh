#!/usr/bin/env bash
# Triton's own QA suites against shoal: scripts/triton-qa.sh /path/to/triton/server [SUITE...]
# (--keep keeps the work folder, --verbose prints failing tests' output). See docs/triton-qa.md.
# The tests dial localhost:8000-8002: where unprivileged user namespaces are allowed, the
# run gets a network namespace of its own (its own loopback) and a /dev/shm of its own, so
# nothing else on the machine is in the way; elsewhere those ports must be free.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${SHOAL_QA_NETNS:-}" ]; then
  scripts/setup.sh
  # What the QA tests import beyond tritonclient, kept out of the project's venv.
  SHOAL_QA_DEPS="${XDG_CACHE_HOME:-$HOME/.cache}/shoal-triton-qa/deps"
  export SHOAL_QA_DEPS
  if [ ! -d "$SHOAL_QA_DEPS/sseclient" ] || [ ! -d "$SHOAL_QA_DEPS/psutil" ]; then
    .venv/bin/python -m pip install -q --target "$SHOAL_QA_DEPS" requests sseclient-py psutil
  fi
  if unshare -rnm true 2>/dev/null; then
    # (and a /dev/shm of its own: Triton's shm leak probe refuses to watch the Python-stub
    # regions of any other process on the machine, a real Triton's included)
    exec unshare -rnm env SHOAL_QA_NETNS=1 bash -c \
      'mount -t tmpfs tmpfs /dev/shm && ip link set lo up && exec "$0" "$@"' "$0" "$@"
  fi
fi
exec .venv/bin/python scripts/triton_qa.py "$@"
