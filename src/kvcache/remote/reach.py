"""Checks made once, when a pool is created with a remote: the spec, and that it answers."""

from __future__ import annotations

import os
from typing import Any

from ..errors import InvalidArgument, RemoteError
from ..units import parse_duration
from .urls import DEFAULT_TIMEOUT_S, PASSWORD_ENV, RemoteSpec, connect, failures


def remote_spec(
    url: str | None,
    namespace: str | None,
    write_through: bool,
    timeout: str | float | None,
    password_file: str | os.PathLike[str] | None,
    key_file: str | os.PathLike[str] | None = None,
) -> RemoteSpec | None:
    """``create``'s remote arguments as a spec; None without ``url``.

    Raises:
        InvalidArgument: remote options without a URL, a URL without a namespace,
            or a bad URL, namespace, timeout or password file.
    """
    if url is None:
        if (
            namespace is not None
            or write_through
            or timeout is not None
            or password_file
            or key_file
        ):
            raise InvalidArgument(
                "--namespace, --write-through, --remote-timeout, --password-file and "
                "--remote-key-file need --remote URL"
            )
        return None
    if namespace is None:
        raise InvalidArgument(
            "a remote needs --namespace NAME: hosts that share prefixes use the same one"
        )
    seconds = DEFAULT_TIMEOUT_S if timeout is None else parse_duration(timeout, what="timeout")
    spec = RemoteSpec(
        url, namespace, write_through, seconds, _absolute(password_file), _absolute(key_file)
    )
    spec.password()  # both read now: a typo or a planted file is an error here, not later
    spec.key()
    return spec


def _absolute(path: str | os.PathLike[str] | None) -> str:
    return "" if path is None else os.path.abspath(os.fspath(path))


def check_reachable(spec: RemoteSpec) -> None:
    """PING the remote with the spec's credentials.

    Raises:
        RemoteError: it cannot be reached in time, or refuses the credentials.
        DependencyError: redis-py is not installed.
    """
    errors = failures()
    import redis  # failures() found it

    client: Any = None
    try:
        client = connect(spec)
        client.ping()
    except redis.AuthenticationError as exc:
        raise RemoteError(_refused(spec, exc)) from None
    except redis.ResponseError as exc:  # NOAUTH, WRONGPASS on some versions
        if "auth" in str(exc).lower() or "WRONGPASS" in str(exc):
            raise RemoteError(_refused(spec, exc)) from None
        raise RemoteError(f"remote {spec.url} answered an error: {exc}") from None
    except errors as exc:
        raise RemoteError(
            f"cannot reach remote {spec.url} within {spec.timeout_s:g} s ({exc}): "
            "check the URL and that the server runs (or raise --remote-timeout)"
        ) from None
    except Exception as exc:  # redis-py failing on replies Redis never sends
        raise RemoteError(
            f"remote {spec.url} answered as no Redis or Valkey server does "
            f"({type(exc).__name__}: {exc}): it is not a Redis server; check the URL's port"
        ) from None
    finally:
        if client is not None:
            client.close()


def _refused(spec: RemoteSpec, exc: Exception) -> str:
    source = f"the file {spec.password_file}" if spec.password_file else f"${PASSWORD_ENV}"
    return f"remote {spec.url} refused the credentials ({exc}): set the password in {source}"
