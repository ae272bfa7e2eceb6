"""Where the remote tier is, and how to reach it: URLs, namespaces, passwords, clients.

Accepted URLs::

    redis://HOST[:PORT][/DB]           rediss://... (TLS)
    unix:///PATH/TO/SOCKET[?db=N]
    redis+cluster://HOST:PORT[,HOST:PORT...]   rediss+cluster://... (TLS)

``valkey://`` and ``valkeys://`` are accepted as other names for ``redis`` and
``rediss`` (Valkey speaks the same protocol). A TLS URL may name the files of a
private certificate authority and of a client certificate:
``rediss://HOST:PORT/0?ssl_ca_certs=/etc/kvcache/ca.pem&ssl_certfile=...&ssl_keyfile=...``;
without them the system's authorities are trusted. A user name may be given in the
URL (Redis ACLs); a password never is: command lines are visible to every
user in ``ps``. It comes from ``$KVCACHE_REDIS_PASSWORD``, or from a file
named in the pool's settings (``password_file``; ``kvcache.settings`` says whose
settings a process follows). Those files, the TLS files and the key file are
opened as :mod:`kvcache.safepath` opens files (the caller's own or root's, no
planted symlinks, never a FIFO).

redis-py is imported here, and only when a client is made: the core of
kvcache never needs it (``pip install 'kvcache[redis]'``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, parse_qsl, urlsplit

from ..errors import DependencyError, InvalidArgument
from ..safepath import open_given

PASSWORD_ENV = "KVCACHE_REDIS_PASSWORD"
DEFAULT_TIMEOUT_S = 0.25
"""Long enough for a loopback or LAN round trip with a big value, short enough that a
stalled server costs a caller a quarter second once before the tier is marked down."""
MAX_URL_CHARS = 255  # the header field
_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SCHEMES = {
    "redis": ("redis", False),
    "rediss": ("rediss", False),
    "valkey": ("redis", False),
    "valkeys": ("rediss", False),
    "unix": ("unix", False),
    "redis+cluster": ("redis", True),
    "rediss+cluster": ("rediss", True),
    "valkey+cluster": ("redis", True),
    "valkeys+cluster": ("rediss", True),
}
TLS_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
"""The query options a TLS URL may have: paths, passed to redis-py's client as they are."""


@dataclass(frozen=True)
class RemoteSpec:
    """A pool's remote tier, as its header keeps it.

    Attributes:
        url: the server or cluster (no password in it).
        namespace: the first part of every key; hosts that share use the same one.
        write_through: also send each put to the remote at once (other hosts
            see it at once), not only what the local tiers evict.
        timeout_s: a call slower than this marks the remote down.
        password_file: a file holding the password; "" = ``$KVCACHE_REDIS_PASSWORD``.
        key_file: a file holding the key that signs every record (``records``); ""
            = records are not signed, and whoever may write the namespace decides
            what every host reads.
    """

    url: str
    namespace: str
    write_through: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S
    password_file: str = ""
    key_file: str = ""

    def __post_init__(self) -> None:
        check_url(self.url)
        check_namespace(self.namespace)
        if not 0 < self.timeout_s <= 60:
            raise InvalidArgument(
                f"remote timeout must be between 0 and 60 s, not {self.timeout_s!r}"
            )

    @property
    def is_cluster(self) -> bool:
        return _SCHEMES[urlsplit(self.url).scheme][1]

    def password(self) -> str | None:
        """The password: from ``password_file`` if set, else the environment, else none."""
        if not self.password_file:
            return os.environ.get(PASSWORD_ENV) or None
        raw = read_secret(self.password_file, "password file", "--password-file")
        return raw.decode("utf-8", "replace").strip() or None

    def key(self) -> bytes | None:
        """The key that signs records, or None when records are not signed.

        Raises:
            InvalidArgument: the key file cannot be read, or holds under 16 bytes of key.
        """
        if not self.key_file:
            return None
        text = read_secret(self.key_file, "key file", "--remote-key-file").strip()
        try:
            key = bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            key = text  # not hex: the bytes themselves
        if len(key) < MIN_KEY_BYTES:
            raise InvalidArgument(
                f"the remote's key file {self.key_file} holds {len(key)} bytes of key, under "
                f"{MIN_KEY_BYTES}: write one with `openssl rand -hex 32 > {self.key_file}`"
            )
        return key[:MAX_KEY_BYTES]


MIN_KEY_BYTES = 16
MAX_KEY_BYTES = 64  # BLAKE2b's longest key
MAX_SECRET_BYTES = 4096


def read_secret(path: str, what: str, option: str) -> bytes:
    """The bytes of a small file of secrets, opened safely (see :mod:`kvcache.safepath`).

    Raises:
        InvalidArgument: it cannot be read, is not a regular file of this user or root,
            or is reachable through a folder another user controls.
    """
    try:
        fd = open_given(path, what=f"remote's {what}")
        try:
            return os.read(fd, MAX_SECRET_BYTES)
        finally:
            os.close(fd)
    except OSError as exc:
        raise InvalidArgument(
            f"cannot read the remote's {what} {path}: {exc.strerror or exc}; "
            f"fix it or give another {option}"
        ) from None


def check_url(url: str) -> str:
    """Refuse a URL kvcache cannot use, or one with a password in it."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise InvalidArgument(f"remote URL must be 1 to {MAX_URL_CHARS} characters: {url!r}")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise InvalidArgument(f"remote URL {url!r} does not parse ({exc})") from None
    if parts.scheme not in _SCHEMES:
        raise InvalidArgument(
            f"remote URL {url!r} is not one of redis://, rediss://, unix://, "
            "redis+cluster:// (or valkey:// ...)"
        )
    if _has_password(parts.netloc):
        raise InvalidArgument(
            "the remote URL holds a password, which anyone can read in ps: put it in "
            f"${PASSWORD_ENV} or in a file given with --password-file"
        )
    if parts.scheme == "unix":
        if parts.netloc or not parts.path.startswith("/"):
            raise InvalidArgument(
                f"remote URL {url!r} needs an absolute socket path: unix:///path/to/redis.sock"
            )
    else:
        _nodes(url)  # every host:port must parse
    _options(parts)
    return url


def _options(parts: SplitResult) -> dict[str, str]:
    """The URL's query options: ``db`` (not for a Cluster), and for TLS the ``TLS_FILES``."""
    scheme, is_cluster = _SCHEMES[parts.scheme]
    allowed = (() if is_cluster else ("db",)) + (TLS_FILES if scheme == "rediss" else ())
    try:
        options = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=True))
    except ValueError:
        options = {"": parts.query} if parts.query else {}
    for name, value in options.items():
        if name not in allowed or not value:
            raise InvalidArgument(
                f"remote URL option {name or parts.query!r} is not one kvcache takes here "
                f"({', '.join(allowed) or 'none'})"
            )
    return options


def check_namespace(namespace: str) -> str:
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise InvalidArgument(
            f"namespace must be 1-64 letters, digits, '.', '_' or '-', starting with a "
            f"letter or digit, not {namespace!r}"
        )
    return namespace


def _has_password(netloc: str) -> bool:
    user_info = netloc.rpartition("@")[0]
    return ":" in user_info


def _nodes(url: str) -> list[tuple[str, int]]:
    """(host, port) of each node named in a redis:// or cluster URL."""
    netloc = urlsplit(url).netloc.rpartition("@")[2]
    nodes: list[tuple[str, int]] = []
    for node in netloc.split(","):
        host, _, port = node.rpartition(":") if ":" in node.lstrip("[") else (node, "", "6379")
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgument(f"remote URL {url!r}: {node!r} is not HOST:PORT")
        nodes.append((host, int(port)))
    return nodes


def failures() -> tuple[type[BaseException], ...]:
    """What redis-py raises when the remote fails (a miss, never the caller's error).

    Raises:
        DependencyError: redis-py is not installed.
    """
    try:
        import redis
        from redis.exceptions import RedisClusterException
    except ImportError:
        raise DependencyError(
            "the remote tier needs redis-py: pip install 'kvcache[redis]'"
        ) from None
    # RedisClusterException (no node for a slot, no node answers) is not a RedisError
    return (redis.RedisError, RedisClusterException, OSError, ValueError)


def connect(spec: RemoteSpec) -> Any:
    """A redis-py client for ``spec`` (a Cluster client asks a node for the slot map).

    Every call is bounded by ``spec.timeout_s`` and made once (no retries
    inside redis-py): the tier's own backoff decides when to try again.

    Raises:
        DependencyError: redis-py is not installed.
        one of :func:`failures`: a Cluster that does not answer.
    """
    failures()  # redis-py is there
    import redis
    from redis.backoff import NoBackoff
    from redis.cluster import ClusterNode, RedisCluster
    from redis.retry import Retry

    parts = urlsplit(spec.url)
    scheme, _ = _SCHEMES[parts.scheme]
    for option, path in _options(parts).items():
        if option in TLS_FILES:  # redis-py opens them by path: refuse a planted one first
            read_secret(path, f"TLS file ({option})", "URL")
    options: dict[str, Any] = {
        "password": spec.password(),
        "socket_timeout": spec.timeout_s,
        "socket_connect_timeout": spec.timeout_s,
        "retry": Retry(NoBackoff(), 0),
    }
    if parts.username:
        options["username"] = parts.username
    if spec.is_cluster:
        nodes = [ClusterNode(host, port) for host, port in _nodes(spec.url)]
        options.update(_options(parts))  # from_url reads them itself below
        return RedisCluster(startup_nodes=nodes, ssl=scheme == "rediss", **options)
    url = spec.url if scheme == parts.scheme else f"{scheme}{spec.url[len(parts.scheme) :]}"
    return redis.Redis.from_url(url, **options)
