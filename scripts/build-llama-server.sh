#!/usr/bin/env bash
# Build llama-server into .venv/bin (the llama-server proxy's tests and benchmark run it; see
# docs/llama-server.md). No Debian package or PyPI wheel ships it, so it is compiled from the
# llama.cpp sources that the llama-cpp-python sdist vendors (the release setup.sh installs,
# KVCACHE_LLAMA=... as there): the server target alone, statically linked, about 7 minutes on
# 2 cores. -DLLAMA_USE_PREBUILT_UI=OFF, or the build downloads the web UI; GGML_NATIVE=OFF for
# a binary that runs on any x86-64 CI machine (KVCACHE_LLAMA_CMAKE_ARGS=... replaces it, as
# for llama-cpp-python); OpenSSL off: the proxy talks to it over loopback only.
# Run by setup.sh --llama-cpp when .venv/bin/llama-server is missing.
# llama-cpp-python is not built against these libraries (-DLLAMA_BUILD=OFF with
# LLAMA_CPP_LIB_PATH) to save its own compile: its import would then rest on shared
# libraries outside its wheel, found through an environment variable every process needs,
# and this build is static. A second full compile costs CI time, not correctness.
# A build is kept in the user's cache folder, named by the release and the flags, so a new
# .venv (CI makes one every run) copies it instead of compiling again; the cache is the
# user's own (0700), as pip's wheel cache is.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
release=${KVCACHE_LLAMA:-llama-cpp-python==0.3.36}
flags=${KVCACHE_LLAMA_CMAKE_ARGS:--DGGML_NATIVE=OFF}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/kvcache
cached=$cache/llama-server-$(printf '%s\n%s\n%s' "$release" "$flags" "$(uname -m)" | sha256sum | cut -c1-16)
if [ -x "$cached" ] && "$cached" --version >/dev/null 2>&1; then
  install -m 755 "$cached" .venv/bin/llama-server
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# cmake and ninja from PyPI where the system has none (as llama-cpp-python's own build does)
command -v cmake >/dev/null || .venv/bin/python -m pip install --quiet cmake
command -v ninja >/dev/null || .venv/bin/python -m pip install --quiet ninja
PATH=$PWD/.venv/bin:$PATH
.venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps \
  --no-binary :all: -d "$work" "$release"
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
# shellcheck disable=SC2086  # the flags are words
cmake -G Ninja -S "$work"/llama_cpp_python-*/vendor/llama.cpp -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF $flags \
  > "$work/cmake.log" 2>&1 || { cat "$work/cmake.log" >&2; exit 1; }
cmake --build "$work/build" --target llama-server -j "$(nproc)" > "$work/build.log" \
  || { tail -50 "$work/build.log" >&2; exit 1; }
install -m 755 "$work/build/bin/llama-server" .venv/bin/llama-server.tmp
mv -f .venv/bin/llama-server.tmp .venv/bin/llama-server
mkdir -p -m 700 "$cache"
install -m 755 .venv/bin/llama-server "$cached.tmp" && mv -f "$cached.tmp" "$cached"
