"""The Redis clients of both services, built in one place from a ``redis_url.RedisTarget``.

I/O edge (it imports redis-py); the pure config only says where Redis is. Each service states its own
timeouts and retries (:class:`ClientOptions`); this module knows the three kinds of Redis:

- one server (``redis://``, ``rediss://``, ``unix://``): ``redis.asyncio.Redis.from_url``;
- Sentinel: a :class:`SentinelPrimary`, redis-py's Sentinel-managed client. Every connection, new or
  reconnecting, asks the Sentinels which server is the primary, so after a failover the next attempt
  goes to the new one; no restart. While in use the client asks again every second (in the background)
  and moves connections still on a former primary. A connection to a primary that was demoted fails with a
  :class:`~redis.exceptions.ConnectionError` as soon as a write meets ``READONLY`` (redis-py does this for
  commands; :class:`_DemotionAware` does it for scripts too, whose errors Redis 6 wraps in
  ``ERR Error running script``), so the caller's retry reconnects to the new primary;
- Redis Cluster: ``redis.asyncio.RedisCluster``, which follows ``MOVED`` and re-reads the slot map.
  The pool's keys share a hash slot (``pointsman_shared.keys``), so the publish scripts run on one node.

Close a client with ``aclose()`` (a Sentinel client closes its Sentinel connections too).

A new connection sends ``HELLO 3 AUTH`` (with the URL's user and password) and, for a database other
than 0, ``SELECT``; not redis-py's ``CLIENT SETINFO`` nor ``CLIENT MAINT_NOTIFICATIONS``, so a Redis ACL
user needs nothing beyond the commands its service runs (deploy/redis/users.acl). ``rediss://``
verifies the server's certificate and name against the system's CAs (or ``SSL_CERT_FILE``), or against
a one-server URL's ``?ssl_ca_certs=/path/ca.crt``.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any, TypeAlias

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import (
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, RedisError, ResponseError
from redis.maint_notifications import MaintNotificationsConfig

from pointsman_shared import redis_url
from pointsman_shared.redis_url import Cluster, RedisTarget, Standalone, parse_redis_url

RedisClient: TypeAlias = Redis | RedisCluster


@dataclass(frozen=True, kw_only=True)
class ClientOptions:
    """How one service talks to Redis, whatever kind it is."""

    # Each command's read and write (None: unbounded, the caller bounds it).
    socket_timeout: float | None
    # Opening a connection, to a Redis server or a Sentinel.
    connect_timeout: float | None
    # A failed command's retries (connection and timeout errors), with their backoff.
    retry: Retry
    # Ping a connection idle this long before using it (0: never).
    health_check_interval: float = 0.0
    # Each question to a Sentinel ("which server is the primary?"): short, so a dead Sentinel costs
    # little before the next one is asked.
    sentinel_timeout: float = 1.0
    # Ask the Sentinels again this often while the client is in use (in the background, never delaying
    # a command): after a failover that left the old primary up, it stays a writable primary until
    # Sentinel reconfigures it (seconds later), and connections to it would stay put until then.
    sentinel_recheck: float = 1.0

    @classmethod
    def caller_bounded(cls, io_timeout: float) -> ClientOptions:
        """For a caller that bounds each command with ``asyncio.timeout`` and owns retrying: no
        retries inside the client, ``io_timeout`` to connect and per Sentinel question. No socket
        timeout: when set, redis-py wraps writes in ``asyncio.wait_for``, which on Python 3.11 can
        swallow a task's cancellation (gh-86296) and hang shutdown."""
        return cls(
            socket_timeout=None,
            connect_timeout=io_timeout,
            retry=Retry(NoBackoff(), 0),
            sentinel_timeout=io_timeout,
        )


def create_client(target: RedisTarget | str, options: ClientOptions) -> RedisClient:
    """A client for ``target`` (a URL is parsed first; raises RedisUrlError). Nothing connects yet."""
    if isinstance(target, str):
        target = parse_redis_url(target)
    if isinstance(target, Standalone):
        client: Redis = Redis.from_url(target.url, **_connection_kwargs(options))
        return client
    if isinstance(target, redis_url.Sentinel):
        return _sentinel_primary(target, options)
    return _cluster(target, options)


class SentinelPrimary(Redis):
    """A client of the primary the Sentinels name; closing it closes its Sentinel connections too."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        pool = self.connection_pool
        if isinstance(pool, SentinelConnectionPool):
            await pool.sentinel_manager.aclose()


class _SentinelPool(SentinelConnectionPool):
    """redis-py's pool of connections to the Sentinels' primary that also asks the Sentinels every
    ``recheck`` seconds while in use, and moves a connection it hands out that is still on a former
    primary (redis-py asks only when a connection opens)."""

    def __init__(self, service_name: str, sentinel_manager: Sentinel, **kwargs: Any) -> None:
        self._recheck: float = kwargs.pop("recheck")
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]
        self._next_check = 0.0
        self._checking: asyncio.Task[None] | None = None

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        self._recheck_soon()
        connection = await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        primary = self.master_address
        if primary is not None and connection.is_connected and (connection.host, connection.port) != primary:
            try:
                await connection.disconnect()
                await connection.connect()  # asks the Sentinels
            except BaseException:
                await self.release(connection)
                raise
        return connection

    def _recheck_soon(self) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() < self._next_check or (self._checking is not None and not self._checking.done()):
            return
        self._next_check = loop.time() + self._recheck
        self._checking = loop.create_task(self._ask(), name="sentinel-recheck")

    async def _ask(self) -> None:
        # get_master_address drops the idle connections when the primary moved. No answer (Sentinels
        # down or mid-failover) changes nothing: connections fail or not on their own.
        with contextlib.suppress(RedisError, OSError):
            await self.get_master_address()  # type: ignore[no-untyped-call]

    async def aclose(self) -> None:
        if self._checking is not None:
            self._checking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checking
            self._checking = None
        await super().aclose()


class _DemotionAware(SentinelManagedConnection):
    """A connection to the primary that reconnects only where the Sentinels say, and that treats a
    script's wrapped ``READONLY`` as the primary's demotion."""

    _addressed = False  # the address was just asked of the Sentinels (connect_to)

    async def connect_to(self, address: tuple[str, int]) -> None:
        self._addressed = True
        try:
            await super().connect_to(address)  # type: ignore[no-untyped-call]
        finally:
            self._addressed = False

    async def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        # redis-py 8.1 reconnects a dropped connection here (send_packed_command, and so every retry of
        # a command) to the address it had, without asking the Sentinels (redis/redis-py#3874): after a
        # failover each retry would dial the old primary. Ask them first, as a new connection does.
        if not self.is_connected and not self._addressed and self.connection_pool.is_master:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super().connect_check_health(
            check_health=check_health, retry_socket_connect=retry_socket_connect
        )

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except ResponseError as exc:
            if isinstance(exc, ReadOnlyError) or "READONLY" not in str(exc):
                raise
            if not self.connection_pool.is_master:
                raise
            # As redis-py does for a plain READONLY: the next connection asks the Sentinels again.
            await self.disconnect()
            raise RedisConnectionError("the primary was demoted to a replica") from exc


class _DemotionAwareSSL(_DemotionAware, SentinelManagedSSLConnection):
    pass


def _sentinel_primary(target: redis_url.Sentinel, options: ClientOptions) -> SentinelPrimary:
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": options.sentinel_timeout,
        "socket_connect_timeout": options.connect_timeout,
        # The manager tries every Sentinel in turn; retrying one of them would only delay the next.
        "retry": Retry(NoBackoff(), 0),
        "username": target.sentinel_username,
        "password": target.sentinel_password,
        "ssl": target.tls,
        "driver_info": None,
        "maint_notifications_config": MaintNotificationsConfig(enabled=False),
    }
    sentinel = Sentinel(list(target.hosts), sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    client: SentinelPrimary = sentinel.master_for(
        target.master_name,
        redis_class=SentinelPrimary,
        connection_pool_class=_SentinelPool,
        recheck=options.sentinel_recheck,
        connection_class=_DemotionAwareSSL if target.tls else _DemotionAware,
        db=target.db,
        username=target.username,
        password=target.password,
        **_connection_kwargs(options),
    )
    return client


def _cluster(target: Cluster, options: ClientOptions) -> RedisCluster:
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
        username=target.username,
        password=target.password,
        ssl=target.tls,
        **_connection_kwargs(options),
    )


def _connection_kwargs(options: ClientOptions) -> dict[str, Any]:
    return {
        "retry": options.retry,
        "socket_timeout": options.socket_timeout,
        "socket_connect_timeout": options.connect_timeout,
        "health_check_interval": options.health_check_interval,
        # No CLIENT SETINFO nor CLIENT MAINT_NOTIFICATIONS on connect (redis-py's defaults): commands the
        # ACL users would need, for nothing the services use.
        "driver_info": None,
        "maint_notifications_config": MaintNotificationsConfig(enabled=False),
    }
