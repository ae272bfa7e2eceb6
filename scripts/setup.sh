#!/usr/bin/env bash
# Create .venv (Python >= 3.10) and install kvcache with its test and lint tools.
# Sourced by demo.sh and test.sh; safe to run again (pip skips what is there).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { echo "kvcache needs Python 3.10 or newer (python3 is $(python3 --version))" >&2; exit 1; }
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
