#!/usr/bin/env bash
# Run the transformers integration's tests against another transformers release:
#   scripts/test-transformers.sh 4.56.0 [pytest arguments]
# The release and the dependencies it needs (e.g. an older huggingface-hub and tokenizers)
# go into .venv-transformers-VERSION/ with pip --target, once, and come first on PYTHONPATH,
# over .venv's own copies; torch and kvcache stay .venv's. numpy is held to .venv's version,
# so that the copy pip puts there is the one torch and kvcache already run with.
# KVCACHE_PYTHON=/path/to/python uses that environment instead of setting up .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: scripts/test-transformers.sh VERSION [pytest arguments]}
shift
if [ -z "${KVCACHE_PYTHON:-}" ]; then
  bash scripts/setup.sh
fi
python=${KVCACHE_PYTHON:-.venv/bin/python}
target=.venv-transformers-$version
if [ ! -f "$target/.complete" ]; then  # the marker: an interrupted install is redone
  rm -rf "$target"
  constraints=$(mktemp)
  trap 'rm -f "$constraints"' EXIT
  "$python" -c 'import numpy; print(f"numpy=={numpy.__version__}")' >"$constraints"
  "$python" -m pip install --quiet --disable-pip-version-check --target "$target" \
    -c "$constraints" "transformers==$version"
  touch "$target/.complete"
fi
export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
# Fail rather than quietly test .venv's release if the folder did not take precedence.
"$python" -c "import sys, transformers as t; sys.exit(t.__version__ != '$version' and
  f'testing transformers $version, but {t.__file__} is {t.__version__}')"
exec "$python" -m pytest tests/integrations/test_transformers.py tests/integrations/test_devices.py \
  tests/multiprocess/test_prefix_sharing.py "$@"
