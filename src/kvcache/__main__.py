"""``python -m kvcache ...`` runs the same commands as ``kvcache ...``."""

import sys

from .cli import run

sys.exit(run(sys.argv[1:], prog="python -m kvcache"))
