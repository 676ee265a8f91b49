"""Where Redis is: the URL forms both services accept, parsed into one of three typed targets.

Pure (no redis import): the config validates with it; ``pointsman_shared.redis_client`` builds the
clients from what it returns.

- ``redis://``, ``rediss://`` (TLS), ``unix://``: one server, handed to redis-py's ``from_url`` as is
  (:class:`Standalone`);
- ``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master_name[/db]``, ``rediss+sentinel``
  with TLS: the primary the Sentinels name (:class:`Sentinel`; port 26379 by default). The credentials
  are the Redis servers' (primary and replicas), not the Sentinels';
- ``redis+cluster://[[user]:password@]host[:port][,host[:port]...][/0]``, ``rediss+cluster`` with TLS: a
  Redis Cluster reached through any of these nodes (:class:`Cluster`; port 6379 by default). A plain
  ``redis://host:port`` with ``cluster=True`` means the same with one start node.

Every error is a :class:`RedisUrlError` (a ValueError) whose message never repeats a password: a
``/``, ``?``, ``#`` or ``@`` in a user name or password must be percent-encoded, and a URL where one is
not (an ``@`` after the host) is refused here, before redis-py would read part of the password as a
port or a database and say so in its error. :func:`redacted` hides the password of any URL, well formed
or not, and the ``password`` options of the query.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final
from urllib.parse import unquote, urlsplit

SENTINEL_PORT: Final = 26379
REDIS_PORT: Final = 6379
STANDALONE_SCHEMES: Final = ("redis", "rediss", "unix")
SENTINEL_SCHEMES: Final = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES: Final = ("redis+cluster", "rediss+cluster")
SCHEMES: Final = (*STANDALONE_SCHEMES, *SENTINEL_SCHEMES, *CLUSTER_SCHEMES)

Address = tuple[str, int]


class RedisUrlError(ValueError):
    """A Redis URL this module cannot read; the message says why (and never shows a password)."""


@dataclass(frozen=True, slots=True)
class Standalone:
    """One Redis server (or a proxy in front of some): redis-py's own URL forms."""

    url: str = field(repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Sentinel:
    """The primary that the Sentinels at ``hosts`` name ``master_name``; found again after a failover."""

    master_name: str
    hosts: tuple[Address, ...]
    db: int = 0
    # The Redis servers' own credentials (primary and replicas).
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    # The Sentinels' credentials, when they require AUTH (``requirepass`` in sentinel.conf).
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)
    tls: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """A Redis Cluster; ``nodes`` are where discovery starts (any one that answers will do)."""

    nodes: tuple[Address, ...]
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False


RedisTarget = Standalone | Sentinel | Cluster


def parse_redis_url(url: str, *, cluster: bool = False) -> RedisTarget:
    """The target ``url`` names; with ``cluster``, a ``redis://`` or ``rediss://`` URL names a cluster's
    start node. Raises :class:`RedisUrlError`."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise RedisUrlError(f"must start with {', '.join(s + '://' for s in SCHEMES)}")
    if scheme in SENTINEL_SCHEMES:
        if cluster:
            raise RedisUrlError("a Sentinel-managed Redis is not a cluster")
        return _sentinel(scheme, rest)
    if scheme in CLUSTER_SCHEMES:
        return _cluster(scheme, rest)
    if not cluster:
        _check_standalone(scheme, rest)
        return Standalone(url)
    if scheme == "unix":
        raise RedisUrlError("a cluster is reached over TCP: write redis://host:port or redis+cluster://")
    return _cluster(f"{scheme}+cluster", rest)


def redacted(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, for logs.

    The credentials are everything before the last ``@``, so a password holding an unencoded ``/``,
    ``?`` or ``#`` is hidden too; so are the values of query options named like ``password``
    (redis-py's ``?password=``, ``?ssl_password=``).
    """
    scheme, sep, rest = url.partition("://")
    credentials, at, place = rest.rpartition("@")
    if at:
        user, colon, _password = credentials.partition(":")
        rest = f"{user}:***@{place}" if colon else f"***@{place}"
    location, question, query = rest.partition("?")
    if question:
        query = "&".join(_redacted_option(option) for option in query.split("&"))
    return f"{scheme}{sep}{location}{question}{query}"


def _redacted_option(option: str) -> str:
    name, equals, _value = option.partition("=")
    return f"{name}=***" if equals and "password" in unquote(name).lower() else option


def _check_standalone(scheme: str, rest: str) -> None:
    """Refuse what redis-py would misread: credentials cut short by an unencoded ``/?#``, a port or a
    database that is not a number. The messages name the part, never its text."""
    _check_encoded(rest)
    if scheme == "unix":
        return
    parts = urlsplit(f"//{rest}")
    try:
        parts.port  # noqa: B018 (the property parses and range-checks the port)
    except ValueError:
        raise RedisUrlError("the port must be a number from 0 to 65535") from None
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise RedisUrlError("the path is the database: a number")


def _check_encoded(rest: str) -> None:
    """An ``@`` after the first ``/``, ``?`` or ``#`` means credentials holding one of them unencoded."""
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    if "@" in rest[end:]:
        raise RedisUrlError(
            "percent-encode '/', '?', '#' and '@' in the user name and password (%2F, %3F, %23, %40)"
        )


def _sentinel(scheme: str, rest: str) -> Sentinel:
    location, path = _split(rest)
    username, password, hosts = _location(location, SENTINEL_PORT)
    parts = path.split("/") if path else []
    if not parts or not parts[0]:
        raise RedisUrlError("name the primary after the hosts: redis+sentinel://host:port/master_name")
    if len(parts) > 2:
        raise RedisUrlError("the path is /master_name or /master_name/db")
    db = _db(parts[1]) if len(parts) == 2 else 0
    return Sentinel(
        master_name=unquote(parts[0]),
        hosts=hosts,
        db=db,
        username=username,
        password=password,
        tls=scheme.startswith("rediss"),
    )


def _cluster(scheme: str, rest: str) -> Cluster:
    location, path = _split(rest)
    username, password, nodes = _location(location, REDIS_PORT)
    if path and _db(path) != 0:
        raise RedisUrlError("a cluster has database 0 only")
    return Cluster(nodes=nodes, username=username, password=password, tls=scheme.startswith("rediss"))


def _split(rest: str) -> tuple[str, str]:
    """``location`` and ``path`` (without its leading slash) of what follows ``scheme://``."""
    _check_encoded(rest)
    if "?" in rest or "#" in rest:
        raise RedisUrlError("this form takes no query options")
    location, _, path = rest.partition("/")
    return location, path.rstrip("/")


def _location(location: str, default_port: int) -> tuple[str | None, str | None, tuple[Address, ...]]:
    credentials, at, hosts = location.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = credentials.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    if not hosts:
        raise RedisUrlError("name at least one host:port")
    addresses = tuple(_address(host, default_port) for host in hosts.split(","))
    if len(set(addresses)) != len(addresses):
        raise RedisUrlError("a host is listed twice")
    return username, password, addresses


def _address(text: str, default_port: int) -> Address:
    """``host``, ``host:port`` or ``[v6]:port``."""
    if not text.strip():
        raise RedisUrlError("an empty host in the host list")
    try:
        parts = urlsplit(f"//{text.strip()}")
        host, port = parts.hostname, parts.port
    except ValueError:
        raise RedisUrlError(f"bad host:port {text!r}") from None
    if not host or parts.username is not None:
        raise RedisUrlError(f"bad host:port {text!r}")
    return host, port if port is not None else default_port


def _db(text: str) -> int:
    if not text.isdigit():
        raise RedisUrlError(f"the database must be a number, not {text!r}")
    return int(text)
