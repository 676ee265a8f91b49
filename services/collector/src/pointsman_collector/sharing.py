"""Several collector replicas sharing one pool (``collector.sharing``).

- Membership: each replica renews a lease in the pool's ``members`` sorted set every ``leaseTtl / 3``
  (score = expiry, in Redis' own clock, so replicas' clocks do not matter). A replica that stops cleanly
  leaves at once; one that dies drops out when its lease expires.
- Ownership: rendezvous hashing. A pod belongs to the live member with the highest hash of
  ``(member, pod)``, so every replica computes the same split from the same member list, and a replica
  joining or leaving moves only the pods it gains or held. Until a replica sees a membership change it
  keeps its old share, so for up to one renewal period a pod can be scraped twice or by nobody.
- Publishing: each replica stores its pods in the pool's ``shards`` hash; one script drops the shards
  of replicas whose lease expired, merges the rest (a pod in two shards during a handover counts once:
  the newer ``updatedAt`` wins) and publishes the whole pool as one snapshot, exactly as a single
  collector does (docs/redis-schema.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable, Iterable

import orjson
from redis.exceptions import RedisError

from pointsman_collector.sink import publish_error, run_script
from pointsman_shared.aio import raise_if_cancelling
from pointsman_shared.codec import CODEC_VERSION, PoolEncoder
from pointsman_shared.keys import RedisKeys
from pointsman_shared.redis_client import RedisClient
from pointsman_shared.snapshot import PoolSnapshot

log = logging.getLogger(__name__)


def owner(pod: str, members: Iterable[str]) -> str | None:
    """The member that owns ``pod``: the one with the highest hash of (member, pod)."""
    return max(members, key=lambda member: _weight(member, pod), default=None)


def _weight(member: str, pod: str) -> bytes:
    return hashlib.blake2b(f"{member}\0{pod}".encode(), digest_size=8).digest()


class Share:
    """This replica's part of the pool: recomputed when the endpoints or the members change."""

    def __init__(self, me: str, apply: Callable[[tuple[str, ...]], None]) -> None:
        self._me = me
        self._apply = apply
        self._endpoints: tuple[str, ...] = ()
        self._members: tuple[str, ...] = (me,)
        self.owned: tuple[str, ...] = ()

    @property
    def members(self) -> tuple[str, ...]:
        """The live replicas as this one last saw them, itself included."""
        return self._members

    def set_endpoints(self, endpoints: tuple[str, ...]) -> None:
        self._endpoints = endpoints
        self._update()

    def set_members(self, members: Iterable[str]) -> None:
        members = tuple(sorted({*members, self._me}))
        if members != self._members:
            log.info("collector replicas: %s (this one: %s)", ", ".join(members), self._me)
            self._members = members
            self._update()

    def _update(self) -> None:
        owned = tuple(e for e in self._endpoints if owner(e, self._members) == self._me)
        if owned != self.owned:
            self.owned = owned
            self._apply(owned)


# KEYS: members. ARGV: member, lease ms. Returns the live members.
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], 10 * tonumber(ARGV[2]))
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""


class Membership:
    """Renews this replica's lease and reports the live members to ``on_members``."""

    def __init__(
        self,
        client: RedisClient,
        keys: RedisKeys,
        *,
        me: str,
        lease: float,
        on_members: Callable[[list[str]], None],
    ) -> None:
        self._client = client
        self._key = keys.members
        self._me = me
        self._lease = lease
        self._lease_ms = max(1, round(lease * 1000))
        self._on_members = on_members
        self._renew = client.register_script(_RENEW)

    async def renew(self) -> list[str]:
        """Renew this replica's lease; return the live members. Raises RedisError or OSError."""
        members = await run_script(self._renew, [self._key], [self._me, self._lease_ms])
        return [m.decode() if isinstance(m, bytes) else str(m) for m in members]

    async def run(self) -> None:
        """Renew every ``lease / 3`` until cancelled; leave the set on the way out."""
        failing = False
        try:
            while True:
                try:
                    members = await self.renew()
                except Exception as exc:  # Redis down, or a bug: keep trying, the lease is the truth
                    if not failing:
                        bug = None if isinstance(exc, RedisError | OSError) else exc
                        log.warning("cannot renew the collector lease: %s", exc, exc_info=bug)
                    failing = True
                else:
                    failing = False
                    self._on_members(members)
                # A cancel() that lands in the Redis call can be swallowed there (the renewal returns as
                # usual; seen at shutdown in about one run in three of the in-process sharing test):
                # without this the loop renews on and stopping waits forever.
                raise_if_cancelling()
                await asyncio.sleep(self._lease / 3)
        finally:
            # Leave at once so the others take over now; if Redis does not answer, the lease expires.
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                async with asyncio.timeout(0.5):
                    await self._client.zrem(self._key, self._me)


# KEYS: sequence, snapshot, channel, members, shards.
# ARGV: member, this member's pods (one "address\tupdatedAt\tpod JSON" line each), snapshot TTL ms,
#       pool name as a JSON string, publishedAt, codec version.
_PUBLISH_SHARD = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[5], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[5], ARGV[3])
local alive = {}
alive[ARGV[1]] = true
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], now, '+inf')) do alive[m] = true end
local best, stamp, order = {}, {}, {}
local shards = redis.call('HGETALL', KEYS[5])
for i = 1, #shards, 2 do
  if not alive[shards[i]] then
    redis.call('HDEL', KEYS[5], shards[i])
  else
    for line in string.gmatch(shards[i + 1], '[^\\n]+') do
      local address, updated, pod = string.match(line, '^([^\\t]*)\\t([^\\t]*)\\t(.*)$')
      local at = tonumber(updated)
      if best[address] == nil then table.insert(order, address) end
      if best[address] == nil or at > stamp[address] then
        best[address], stamp[address] = pod, at
      end
    end
  end
end
table.sort(order)
local pods = {}
for i, address in ipairs(order) do pods[i] = best[address] end
local blob = '{"codec":' .. ARGV[6] .. ',"pool":' .. ARGV[4] .. ',"publishedAt":' .. ARGV[5]
  .. ',"pods":[' .. table.concat(pods, ',') .. ']}'
local v = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], 'version', v, 'data', blob)
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('PUBLISH', KEYS[3], v)
return v
"""


class ShardSink:
    """A :class:`~pointsman_collector.sink.SnapshotSink` for a sharing replica: publishes its pods merged
    with the other live replicas' into the one pool snapshot."""

    def __init__(self, client: RedisClient, keys: RedisKeys, *, me: str, ttl: float) -> None:
        self._keys = (keys.sequence, keys.snapshot, keys.channel, keys.members, keys.shards)
        self._me = me
        self._ttl_ms = max(1, round(ttl * 1000))
        self._script = client.register_script(_PUBLISH_SHARD)
        self._encoder = PoolEncoder()  # pods not scraped since the last publish keep their bytes

    async def publish(self, pool: PoolSnapshot) -> int:
        lines = b"\n".join(
            b"%s\t%r\t%s" % (pod.address.encode(), pod.updated_at, data)
            for pod, data in zip(pool.pods, self._encoder.pods(pool.pods), strict=True)
        )
        pool_name = orjson.dumps(pool.pool)
        args = (self._me, lines, self._ttl_ms, pool_name, repr(pool.published_at), CODEC_VERSION)
        try:
            version = await run_script(self._script, self._keys, args)
        except (RedisError, OSError) as exc:
            raise publish_error(exc) from None
        return int(version)
