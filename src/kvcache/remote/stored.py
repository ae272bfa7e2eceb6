"""A pool header's remote fields: written at create, read by every open."""

from __future__ import annotations

import logging

import numpy as np

from ..errors import InvalidArgument
from .urls import RemoteSpec

log = logging.getLogger(__name__)


def write_spec(header: np.ndarray, spec: RemoteSpec | None) -> None:
    """Record ``spec`` (None: no remote) in a new header (a ``layout.HEADER_DTYPE`` record)."""
    if spec is None:
        return
    header["remote_url"] = spec.url.encode()
    header["remote_namespace"] = spec.namespace.encode()
    header["remote_password_file"] = spec.password_file.encode()
    header["remote_write_through"] = int(spec.write_through)
    header["remote_timeout_s"] = spec.timeout_s


def read_spec(header: np.ndarray, pool_name: str) -> RemoteSpec | None:
    """The remote a header names; None if none, or if the fields are damaged (logged)."""
    raw = header["remote_url"].item()
    if not raw:
        return None
    try:
        return RemoteSpec(
            raw.decode("utf-8"),
            header["remote_namespace"].item().decode("utf-8"),
            write_through=bool(header["remote_write_through"]),
            timeout_s=float(header["remote_timeout_s"]),
            password_file=header["remote_password_file"].item().decode("utf-8"),
        )
    except (UnicodeDecodeError, InvalidArgument) as exc:
        log.warning("pool '%s' names a damaged remote (%s): working without it", pool_name, exc)
        return None
