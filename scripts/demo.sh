#!/usr/bin/env bash
# Set up, then run the demo: a pool shared by two separate processes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m kvcache.demo "$@"
