"""Several collector replicas sharing one pool (``collector.sharing``).

- Membership: each replica renews a lease in the pool's ``members`` sorted set every ``leaseTtl / 3``
  (score = expiry, in Redis' own clock, so replicas' clocks do not matter). A replica that stops cleanly
  leaves at once; one that dies drops out when its lease expires, and each survivor looks again just
  after that expiry (not at its next renewal), so it takes over within ``leaseTtl`` of the death.
- Ownership: rendezvous hashing. A pod belongs to the live member with the highest hash of
  ``(member, pod)``, so every replica computes the same split from the same member list, and a replica
  joining or leaving moves only the pods it gains or held. Until a replica sees a membership change it
  keeps its old share, so for up to one renewal period a pod can be scraped twice or by nobody.
- Publishing: each replica stores its pods in the pool's ``shards`` hash; one script merges every shard
  and publishes the whole pool as one snapshot, exactly as a single collector does
  (docs/redis-schema.md). A pod in several shards counts once: a live replica's reading beats a dead
  replica's, which beats a live replica's ``pending`` entry (one not scraped yet); among equals the newer
  ``updatedAt`` wins. A replica that died or left keeps its shard in the merge while its pods' data is
  within ``collector.staleness`` (then the shard is deleted), so its pods stay published, with their last
  data, until their new owner has scraped them: no gap when a replica dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable, Iterable

import orjson
from redis.exceptions import RedisError

from pointsman_collector.normalize import PENDING
from pointsman_collector.sink import publish_error, run_script
from pointsman_shared.aio import raise_if_cancelling
from pointsman_shared.codec import CODEC_VERSION, PoolEncoder
from pointsman_shared.keys import RedisKeys
from pointsman_shared.redis_client import RedisClient
from pointsman_shared.snapshot import PodSnapshot, PoolSnapshot

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


# KEYS: members. ARGV: member, lease ms. Returns Redis' time (ms), then each live member and its expiry.
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], 10 * tonumber(ARGV[2]))
local out = {now}
local members = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #members do out[i + 1] = members[i] end
return out
"""
# How long after a peer's lease runs out (by Redis' clock) a survivor looks again: the asyncio timer's
# and the millisecond clock's rounding.
EXPIRY_MARGIN = 0.002


class Membership:
    """Renews this replica's lease and reports the live members to ``on_members``.

    It renews every ``lease / 3``, and sooner when another member's lease runs out before then: a peer
    renews every ``lease / 3`` too, so its lease normally ends ``2/3 lease`` or more after any renewal of
    ours, and only a peer that stopped renewing (died) brings the next look forward. A survivor so sees a
    death ``EXPIRY_MARGIN`` after the lease ends, not up to ``lease / 3`` later, for at most one extra
    renewal per death.
    """

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
        members, _ = await self.renew_lease()
        return members

    async def renew_lease(self) -> tuple[list[str], float | None]:
        """Renew this replica's lease; return the live members and the seconds until the first other
        member's lease runs out (``None`` when alone). Raises RedisError or OSError."""
        now, *pairs = await run_script(self._renew, [self._key], [self._me, self._lease_ms])
        members = [m.decode() if isinstance(m, bytes) else str(m) for m in pairs[::2]]
        ends = [float(end) for member, end in zip(members, pairs[1::2], strict=True) if member != self._me]
        return members, (min(ends) - float(now)) / 1000 if ends else None

    async def run(self) -> None:
        """Renew every ``lease / 3`` (sooner, just after a peer's lease runs out) until cancelled; leave
        the set on the way out."""
        failing = False
        try:
            while True:
                wait = self._lease / 3
                try:
                    members, peer_ends = await self.renew_lease()
                except Exception as exc:  # Redis down, or a bug: keep trying, the lease is the truth
                    if not failing:
                        bug = None if isinstance(exc, RedisError | OSError) else exc
                        log.warning("cannot renew the collector lease: %s", exc, exc_info=bug)
                    failing = True
                else:
                    failing = False
                    self._on_members(members)
                    if peer_ends is not None:
                        wait = min(wait, max(peer_ends, 0.0) + EXPIRY_MARGIN)
                # A cancel() that lands in the Redis call can be swallowed there (the renewal returns as
                # usual; seen at shutdown in about one run in three of the in-process sharing test):
                # without this the loop renews on and stopping waits forever.
                raise_if_cancelling()
                await asyncio.sleep(wait)
        finally:
            # Leave at once so the others take over now; if Redis does not answer, the lease expires.
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                async with asyncio.timeout(0.5):
                    await self._client.zrem(self._key, self._me)


# KEYS: sequence, snapshot, channel, members, shards.
# ARGV: member, this member's pods (one "address\tupdatedAt\tpod JSON" line each; updatedAt -1 for a pod
#       not scraped yet), snapshot TTL ms, pool name as a JSON string, publishedAt, codec version,
#       staleness (s).
# A pod's entry ranks: 2 from a live member, 1 from a member that died or left (kept only while its data
# is within staleness of publishedAt: never older data as fresh), 0 a live member's "pending"; among
# equal ranks the larger updatedAt wins. A dead member's shard with nothing left to keep is deleted.
_PUBLISH_SHARD = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[5], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[5], ARGV[3])
local alive = {}
alive[ARGV[1]] = true
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], now, '+inf')) do alive[m] = true end
local published, staleness = tonumber(ARGV[5]), tonumber(ARGV[7])
local best, rank, stamp, order = {}, {}, {}, {}
local shards = redis.call('HGETALL', KEYS[5])
for i = 1, #shards, 2 do
  local live, kept = alive[shards[i]], false
  for line in string.gmatch(shards[i + 1], '[^\\n]+') do
    local address, updated, pod = string.match(line, '^([^\\t]*)\\t([^\\t]*)\\t(.*)$')
    local at = tonumber(updated)
    local r
    if live then
      r = at < 0 and 0 or 2
    elseif at >= 0 and published - at <= staleness then
      r = 1
    end
    if r ~= nil then
      kept = true
      if best[address] == nil then table.insert(order, address) end
      if best[address] == nil or r > rank[address] or (r == rank[address] and at > stamp[address]) then
        best[address], rank[address], stamp[address] = pod, r, at
      end
    end
  end
  if not live and not kept then redis.call('HDEL', KEYS[5], shards[i]) end
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
    with the other replicas' into the one pool snapshot.

    ``staleness`` (``collector.staleness``) bounds how long a dead replica's pods stay in the merge. Why
    there and not in the collector: a re-owned pod starts ``pending`` (no data, unhealthy) until its
    first scrape here, up to an interval later, while the publisher publishes within half a one. Seeding
    it from the last merged snapshot would need that snapshot read back from Redis on every re-own (the
    script returns only the version), and leaving it out until its first scrape would leave it out of
    the snapshot altogether once the dead shard is gone. Keeping the dead shard in the merge, ranked below
    any reading of a live replica, needs neither: the last data stays published, fresh by the same
    staleness rule every pod is judged by, until its new owner has read the pod (a failed first scrape
    replaces it too), and a pod that is new to the pool, in no shard yet, is still published ``pending``.
    """

    def __init__(
        self, client: RedisClient, keys: RedisKeys, *, me: str, ttl: float, staleness: float = 2.0
    ) -> None:
        self._keys = (keys.sequence, keys.snapshot, keys.channel, keys.members, keys.shards)
        self._me = me
        self._ttl_ms = max(1, round(ttl * 1000))
        self._staleness = repr(float(staleness))
        self._script = client.register_script(_PUBLISH_SHARD)
        self._encoder = PoolEncoder()  # pods not scraped since the last publish keep their bytes

    async def publish(self, pool: PoolSnapshot) -> int:
        lines = b"\n".join(
            b"%s\t%s\t%s" % (pod.address.encode(), _stamp(pod), data)
            for pod, data in zip(pool.pods, self._encoder.pods(pool.pods), strict=True)
        )
        pool_name = orjson.dumps(pool.pool)
        args = (
            self._me,
            lines,
            self._ttl_ms,
            pool_name,
            repr(pool.published_at),
            CODEC_VERSION,
            self._staleness,
        )
        try:
            version = await run_script(self._script, self._keys, args)
        except (RedisError, OSError) as exc:
            raise publish_error(exc) from None
        return int(version)


def _stamp(pod: PodSnapshot) -> bytes:
    """The merge's ``updatedAt`` of a pod: -1 for one not scraped yet (the lowest rank), else its own."""
    if not pod.healthy and pod.reason == PENDING:
        return b"-1"
    return repr(pod.updated_at).encode()
