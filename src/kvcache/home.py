"""The kvcache home folder: where a user's snapshots, disk-pool registry and default
disk pools live.

``$KVCACHE_HOME``, else ``$XDG_DATA_HOME/kvcache``, else ``~/.local/share/kvcache``.
It is per user (like every XDG data folder); a relative ``$KVCACHE_HOME`` is taken
from the current folder when it is read.
"""

from __future__ import annotations

import os
from pathlib import Path


def kvcache_home() -> Path:
    """The kvcache home folder (it need not exist yet)."""
    if os.environ.get("KVCACHE_HOME"):
        return Path(os.environ["KVCACHE_HOME"]).absolute()
    data_home = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data_home).absolute() / "kvcache"
