#!/usr/bin/env bash
# Set up, then run the whole test suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --llama-cpp
exec .venv/bin/python -m pytest "$@"
