#!/usr/bin/env bash
# Create .venv (Python >= 3.10) and install kvcache, its test, lint, docs and packaging
# tools, torch and transformers (for kvcache.integrations.transformers, its tests and the
# demo); with --llama-cpp (test.sh passes it) also llama-cpp-python and gguf
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
