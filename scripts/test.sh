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
# pytest's status 5 (nothing collected) is no failure when -k or -m left one run nothing
selecting=$(case " ${options[*]-} " in *" -k"* | *" -m"*) echo 5 ;; *) echo none ;; esac)
pytest_in() {
  "$1"/bin/python -m pytest "${@:2}" || { status=$?; [ "$status" = "$selecting" ] || exit "$status"; }
}
[ ${#main[@]} -eq 0 ] && [ ${#vllm[@]} -ne 0 ] \
  || pytest_in .venv ${options[@]+"${options[@]}"} ${main[@]+"${main[@]}"}
[ ${#main[@]} -ne 0 ] && [ ${#vllm[@]} -eq 0 ] \
  || pytest_in .venv-vllm ${options[@]+"${options[@]}"} "${vllm[@]:-tests/integrations/vllm}"
