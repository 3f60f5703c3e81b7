#!/usr/bin/env bash
# Set up (if needed) and serve the shipped model_repository/ on :8000 (HTTP).
# Extra arguments go to `shoal serve`, e.g. scripts/serve.sh --http-port=9000
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/shoal serve --model-repository model_repository "$@"
