"""Where pool snapshots go: Redis, written atomically by one Lua script (docs/redis-schema.md).

One server, Sentinel's primary or a Redis Cluster (``pointsman_shared.redis_client``): the script's keys
share one hash slot. After a Sentinel failover a failed publish's retry (or the next publish) connects
to the new primary; a demoted primary's ``READONLY`` counts as a connection error, so it is retried too.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Protocol

from redis.asyncio.retry import Retry
from redis.backoff import AbstractBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from pointsman_collector.errors import PublishError
from pointsman_shared.backoff import Backoff, Jitter
from pointsman_shared.codec import PoolEncoder
from pointsman_shared.keys import RedisKeys
from pointsman_shared.redis_client import ClientOptions, RedisClient, create_client
from pointsman_shared.redis_url import RedisTarget
from pointsman_shared.snapshot import PoolSnapshot


class SnapshotSink(Protocol):
    async def publish(self, pool: PoolSnapshot) -> int:
        """Store ``pool`` (its ``version`` is ignored) and return the version the store assigned.

        Raises :class:`PublishError`.
        """
        ...


# One round trip, and readers never see a version without its data: the counter, the hash, its expiry
# and the notification change together. KEYS: sequence, snapshot, channel (one hash slot, see keys.py).
_PUBLISH = """
local v = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], 'version', v, 'data', ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('PUBLISH', KEYS[3], v)
return v
"""

_SOCKET_TIMEOUT = 1.0
# A publish happens at least every second: a few quick retries ride out a blip without holding the
# publisher for long; a failed publish is retried on the publisher's next round. Full jitter from 40 ms,
# doubling, capped at 250 ms: the two sleeps add at most 40 + 80 ms to a failing publish, far below the
# 2 s staleness budget of the readers (``collector.staleness``, ``picker.maxStaleness``); the socket
# timeouts, not the backoff, bound how long a publish to a dead Redis takes.
PUBLISH_RETRY = Backoff(initial=0.04, factor=2.0, maximum=0.25, jitter=Jitter.FULL)
PUBLISH_RETRIES = 2


class RedisSnapshotSink:
    def __init__(self, client: RedisClient, keys: RedisKeys, *, ttl: float) -> None:
        self._client = client
        self._keys = (keys.sequence, keys.snapshot, keys.channel)
        self._ttl_ms = max(1, round(ttl * 1000))
        # register_script runs EVALSHA and reloads the script if Redis lost it (after a restart).
        self._script = client.register_script(_PUBLISH)
        self._encoder = PoolEncoder()  # pods not scraped since the last publish keep their bytes

    @classmethod
    def from_url(cls, url: RedisTarget | str, keys: RedisKeys, *, ttl: float) -> RedisSnapshotSink:
        return cls(redis_client(url), keys, ttl=ttl)

    @property
    def client(self) -> RedisClient:
        return self._client

    async def publish(self, pool: PoolSnapshot) -> int:
        blob = self._encoder.pool(pool)
        try:
            version = await run_script(self._script, self._keys, (blob, self._ttl_ms))
        except (RedisError, OSError) as exc:
            raise publish_error(exc) from None
        return int(version)

    async def aclose(self) -> None:
        await self._client.aclose()


def redis_client(target: RedisTarget | str, *, rng: random.Random | None = None) -> RedisClient:
    """A client (one server, Sentinel's primary or a cluster) that retries a failed command
    :data:`PUBLISH_RETRIES` times, as :data:`PUBLISH_RETRY` says."""
    return create_client(
        target,
        ClientOptions(
            retry=Retry(RetryBackoff(PUBLISH_RETRY, rng or random.Random()), retries=PUBLISH_RETRIES),
            socket_timeout=_SOCKET_TIMEOUT,
            connect_timeout=_SOCKET_TIMEOUT,
            health_check_interval=30,
            sentinel_timeout=_SOCKET_TIMEOUT,
        ),
    )


async def run_script(script: AsyncScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """``script`` on ``keys`` and ``args``. redis-py's script loads itself when Redis answers NOSCRIPT; if the
    server changed between that load and the call (a Sentinel failover: the load went to the demoted
    primary, the retried call to the new one), the call meets NOSCRIPT again: load it there, once."""
    try:
        return await script(keys=keys, args=args)
    except NoScriptError:
        return await script(keys=keys, args=args)


class RetryBackoff(AbstractBackoff):
    """redis-py's retry loop sleeping as a shared :class:`~pointsman_shared.backoff.Backoff` says.

    redis-py counts ``failures`` from 1, as ``Backoff.delay`` does.
    """

    def __init__(self, backoff: Backoff, rng: random.Random) -> None:
        self._backoff = backoff
        self._rng = rng

    def compute(self, failures: int) -> float:
        return self._backoff.delay(failures, self._rng)


def publish_error(exc: RedisError | OSError) -> PublishError:
    """The :class:`PublishError` for a failed Redis call; its reason says whose fault it was."""
    if isinstance(exc, RedisTimeoutError):
        return PublishError("timeout", str(exc))
    if isinstance(exc, RedisConnectionError | OSError):
        return PublishError("connection", str(exc))
    return PublishError("server", str(exc))
