#!/usr/bin/env bash
# Set up, then run the demo: a pool shared by two separate processes.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --vllm ]; then  # two vLLM processes (docs/vllm.md), in vLLM's own venv
  bash scripts/setup.sh --vllm
  shift
  exec .venv-vllm/bin/python -m kvcache.integrations.vllm.demo "$@"
fi
bash scripts/setup.sh
exec .venv/bin/python -m kvcache.demo "$@"
