"""Where the picker gets the pool's state: an in-memory copy of the newest snapshot.

Requests only ever read the in-memory copy (:meth:`SnapshotFeed.current`); refreshing it is a
background job. :class:`RedisSnapshotSource` re-reads the snapshot hash when the collector announces a
new version on the pool's channel, and polls it as a safety net. When Redis is unreachable it keeps the
last copy and retries with backoff. When the hash is gone (it expires when the collector dies), there is
no snapshot: ``pool.failureMode`` decides (see the director).

Beside the snapshot, the pool's cluster objects (InferenceObjectives and InferenceModelRewrites the
collector read from Kubernetes, ``cluster_codec``) are read in the same round trip by their stamp, and
decoded only when the stamp changed; each new set goes to the callback :meth:`SnapshotFeed.watch_cluster`
named. A set that cannot be decoded, a hash that is gone and an outage all keep the last good set.

Redis may be one server, Sentinel's primary or a cluster (``pointsman_shared.redis_client``). After a
Sentinel failover the reads' next connection asks the Sentinels for the new primary, and the lost
subscription is made again there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from typing import Protocol

from redis.exceptions import RedisError

from pointsman_picker.interfaces import SnapshotSource
from pointsman_shared.aio import wait_event
from pointsman_shared.backoff import Backoff, Jitter
from pointsman_shared.cluster import ClusterObjects
from pointsman_shared.cluster_codec import ClusterCodecError, decode_cluster
from pointsman_shared.codec import CodecError, decode_pool
from pointsman_shared.keys import RedisKeys
from pointsman_shared.redis_client import ClientOptions, RedisClient, create_client
from pointsman_shared.redis_url import RedisTarget, parse_redis_url
from pointsman_shared.snapshot import PoolSnapshot

log = logging.getLogger(__name__)


class SnapshotFeed(SnapshotSource, Protocol):
    """A :class:`~pointsman_picker.interfaces.SnapshotSource` kept fresh by a background job."""

    async def wait_ready(self) -> None:
        """Return once a first snapshot has arrived."""

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    def watch_cluster(self, apply: ApplyCluster) -> None:
        """Call ``apply`` with each new set of cluster objects (at once with the current one, if any)."""


ApplyCluster = Callable[[ClusterObjects], None]


class StaticSnapshotSource:
    """A snapshot held in memory and replaced by hand: for tests and benchmarks."""

    def __init__(self, snapshot: PoolSnapshot | None = None) -> None:
        self._snapshot: PoolSnapshot | None = None
        self._ready = asyncio.Event()
        self._cluster: ClusterObjects | None = None
        self._apply: ApplyCluster | None = None
        self.set(snapshot)

    def watch_cluster(self, apply: ApplyCluster) -> None:
        self._apply = apply
        if self._cluster is not None:
            apply(self._cluster)

    def set_cluster(self, objects: ClusterObjects) -> None:
        self._cluster = objects
        if self._apply is not None:
            self._apply(objects)

    def set(self, snapshot: PoolSnapshot | None) -> None:
        self._snapshot = snapshot
        if snapshot is not None:
            self._ready.set()

    def current(self) -> PoolSnapshot | None:
        return self._snapshot

    async def wait_ready(self) -> None:
        await self._ready.wait()

    async def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


# Redis back after an outage must mean fresh routing within a couple of intervals, not after a backoff
# that outgrew picker.maxStaleness (2 s): the retries stay under half a second, jittered so that many
# picker replicas do not come back in step.
RETRY = Backoff(initial=0.1, maximum=0.5, jitter=Jitter.EQUAL)
# A subscription that hears nothing this long is made again (five of the collector's once-a-second
# announcements missed): polling keeps the copy fresh meanwhile, the subscription only speeds it up.
SILENCE = 5.0


class RedisSnapshotSource:
    """The snapshot of ``keys`` in the Redis ``target`` names (a URL is parsed at once: RedisUrlError)."""

    def __init__(
        self,
        target: RedisTarget | str,
        keys: RedisKeys,
        *,
        poll_interval: float = 0.5,
        backoff: Backoff = RETRY,
        io_timeout: float = 1.0,
        silence: float = SILENCE,
        rng: random.Random | None = None,
    ) -> None:
        self._target = parse_redis_url(target) if isinstance(target, str) else target
        self._keys = keys
        self._poll_interval = poll_interval
        self._backoff = backoff
        self._rng = rng if rng is not None else random.Random()
        self._io_timeout = io_timeout
        self._silence = silence
        self._snapshot: PoolSnapshot | None = None
        self._blob = b""  # the encoded self._snapshot
        self._ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._client: RedisClient | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._bad_version: int | None = None
        self._cluster: ClusterObjects | None = None
        self._cluster_stamp: bytes | None = None  # of the last set read, good or not
        self._apply: ApplyCluster | None = None

    def current(self) -> PoolSnapshot | None:
        return self._snapshot

    async def wait_ready(self) -> None:
        await self._ready.wait()

    def watch_cluster(self, apply: ApplyCluster) -> None:
        self._apply = apply
        if self._cluster is not None:
            apply(self._cluster)

    @property
    def cluster(self) -> ClusterObjects | None:
        """The last good set of cluster objects read (``None`` before the first)."""
        return self._cluster

    async def start(self) -> None:
        # The loops below own retrying, with their own backoff; reads are bounded with asyncio.timeout
        # in refresh().
        self._client = create_client(self._target, ClientOptions.caller_bounded(self._io_timeout))
        self._tasks = [
            asyncio.create_task(self._poll_loop(), name="snapshot-poll"),
            asyncio.create_task(self._subscribe_loop(), name="snapshot-subscribe"),
        ]

    async def aclose(self) -> None:
        pending = set(self._tasks)
        for _ in range(3):  # a cancellation lost inside a library call gets repeated
            if not pending:
                break
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=1.0)
        if pending:
            log.warning("%d snapshot tasks did not stop", len(pending))
        self._tasks = []
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def refresh(self) -> None:
        """Read the snapshot hash once and swap the in-memory copy if the version changed."""
        assert self._client is not None, "start() first"
        async with asyncio.timeout(self._io_timeout):
            pipe = self._client.pipeline(transaction=False)  # one round trip: the keys share a slot
            pipe.hmget(self._keys.snapshot, ["version", "data"])
            pipe.hmget(self._keys.cluster, ["stamp"])
            (version_raw, data), (cluster_stamp,) = await pipe.execute()
            if isinstance(cluster_stamp, str):
                cluster_stamp = cluster_stamp.encode()
            if cluster_stamp is not None and cluster_stamp != self._cluster_stamp:
                await self._read_cluster()
        if version_raw is None or data is None:
            if self._snapshot is not None:
                log.warning("snapshot %s is gone (collector down?): no snapshot now", self._keys.snapshot)
            self._snapshot = None
            return
        try:
            version = int(version_raw)
        except ValueError:
            self._reject(-1, f"version {version_raw!r} is not an integer")
            return
        blob = data if isinstance(data, bytes) else data.encode()
        # The same version with other data is another snapshot: after a Sentinel failover the new
        # primary's counter can be a few publishes behind the old one's, and hand out a version again.
        if self._snapshot is not None and self._snapshot.version == version and blob == self._blob:
            return
        try:
            snapshot = decode_pool(blob, version)
        except CodecError as exc:
            self._reject(version, str(exc))
            return
        if self._snapshot is None:
            log.info("snapshot version %d: %d pods", version, len(snapshot.pods))
        self._snapshot, self._blob = snapshot, blob
        self._ready.set()

    async def _read_cluster(self) -> None:
        assert self._client is not None
        stamp, data = await self._client.hmget(self._keys.cluster, ["stamp", "data"])
        if stamp is None or data is None:
            return  # gone meanwhile: the last set stays
        self._cluster_stamp = stamp if isinstance(stamp, bytes) else stamp.encode()
        try:
            objects = decode_cluster(data if isinstance(data, bytes) else data.encode())
        except ClusterCodecError as exc:
            log.error("ignoring the cluster objects %s (keeping the last set): %s", self._keys.cluster, exc)
            return
        self._cluster = objects
        if self._apply is not None:
            self._apply(objects)

    def _reject(self, version: int, why: str) -> None:
        if self._bad_version != version:  # once per bad version, not once per poll
            log.error("ignoring snapshot %s version %d: %s", self._keys.snapshot, version, why)
            self._bad_version = version

    async def _poll_loop(self) -> None:
        failures = 0
        while True:
            self._wake.clear()
            try:
                await self.refresh()
            except (RedisError, OSError, TimeoutError) as exc:
                failures += 1
                if failures == 1:
                    log.warning("cannot read the snapshot from Redis (keeping the last copy): %s", exc)
                wait = self._backoff.delay(failures, self._rng)
            else:
                if failures:
                    log.info("snapshot reads from Redis work again after %d failures", failures)
                failures = 0
                wait = self._poll_interval
            await wait_event(self._wake, wait)

    async def _subscribe_loop(self) -> None:
        assert self._client is not None
        failures = 0
        while True:
            # A cluster client reads the slot map first: its pub/sub picks the node by the channel's slot.
            pubsub = None
            try:
                await self._client.initialize()
                pubsub = self._client.pubsub(ignore_subscribe_messages=True)
                await pubsub.subscribe(self._keys.channel)
                self._wake.set()  # publishes may have been missed while unsubscribed
                failures = 0
                loop = asyncio.get_running_loop()
                heard = loop.time()
                # The collector announces at least once a second. A subscription silent for longer may
                # sit on a server that is no longer the primary (a Sentinel failover that left it up):
                # make it again, on a connection that asks where the primary is.
                while loop.time() - heard < self._silence:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None:
                        heard = loop.time()
                        self._wake.set()
            except Exception as exc:  # Redis unreachable, or a bug: polling goes on, and so do we
                failures += 1
                if failures == 1:
                    bug = None if isinstance(exc, RedisError | OSError) else exc
                    log.warning("snapshot subscription lost (polling continues): %s", exc, exc_info=bug)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(RedisError, OSError):
                        await pubsub.aclose()  # type: ignore[no-untyped-call]
            await asyncio.sleep(self._backoff.delay(failures, self._rng))
