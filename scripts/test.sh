#!/usr/bin/env bash
# Set up, then run the whole test suite (extra arguments go to pytest).
# tests/integrations/vllm run in .venv-vllm (vLLM pins its own torch and transformers), in a
# second pytest with the same options; test paths go to the run they belong to.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --llama-cpp
bash scripts/setup.sh --vllm
main=() vllm=() options=()
for arg in "$@"; do
  case "$arg" in
    tests/integrations/vllm*) vllm+=("$arg") ;;
    -*) options+=("$arg") ;;
    *) if [ -e "${arg%%::*}" ]; then main+=("$arg"); else options+=("$arg"); fi ;;
  esac
done
[ ${#main[@]} -eq 0 ] && [ ${#vllm[@]} -ne 0 ] \
  || .venv/bin/python -m pytest ${options[@]+"${options[@]}"} ${main[@]+"${main[@]}"}
[ ${#main[@]} -ne 0 ] && [ ${#vllm[@]} -eq 0 ] \
  || exec .venv-vllm/bin/python -m pytest ${options[@]+"${options[@]}"} "${vllm[@]:-tests/integrations/vllm}"
