"""Redis Cluster: three primaries on this machine (redis_topology.py), the collector's sinks and the
picker's source through ``redis+cluster://`` (and ``redis: {url: redis://..., cluster: true}``).

Each pool's keys share one hash slot (``{pool}`` in every key name), so the publish scripts run on the
node that owns it; pools land on different nodes; announcements reach the picker through the node its
subscription picked (a plain PUBLISH reaches every node of a cluster).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import RedisCluster
from redis.crc import key_slot
from redis_topology import LocalCluster, local_cluster

from pointsman_collector.sharing import Membership, ShardSink
from pointsman_collector.sink import RedisSnapshotSink, redis_client
from pointsman_picker.snapshots import RedisSnapshotSource
from pointsman_shared.backoff import Backoff
from pointsman_shared.config import parse_config
from pointsman_shared.keys import RedisKeys
from pointsman_shared.redis_url import Cluster
from pointsman_shared.snapshot import PodSnapshot, PoolSnapshot
from pointsman_testkit import eventually

pytestmark = pytest.mark.integration

FAST = Backoff(initial=0.02, maximum=0.1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(Path(tmp_path_factory.mktemp("cluster"))) as running:
        yield running


def pool_on_each_node(size: int = 3) -> list[str]:
    """One pool name per node: the first names whose slot falls in each node's third of the slots."""
    names: dict[int, str] = {}
    for i in range(1000):
        name = f"pool-{i}"
        node = key_slot(RedisKeys(name).snapshot.encode()) * size // 16384
        names.setdefault(node, name)
        if len(names) == size:
            break
    return [names[node] for node in range(size)]


def pool(name: str, *pods: PodSnapshot) -> PoolSnapshot:
    return PoolSnapshot(pool=name, version=0, published_at=time.time(), pods=pods)


def pod(address: str, waiting: int = 0) -> PodSnapshot:
    return PodSnapshot(address=address, waiting=waiting, updated_at=time.time())


@contextlib.asynccontextmanager
async def source_of(url: str, keys: RedisKeys) -> AsyncIterator[RedisSnapshotSource]:
    # Polling once a minute: the announcement, not the poll, brings each new version.
    source = RedisSnapshotSource(url, keys, poll_interval=60.0, backoff=FAST)
    await source.start()
    try:
        yield source
    finally:
        await source.aclose()


async def test_the_collector_publishes_and_the_picker_reads_on_every_node(cluster: LocalCluster) -> None:
    for name in pool_on_each_node():
        await _round_trip(cluster.url, RedisKeys(name))


async def _round_trip(url: str, keys: RedisKeys) -> None:
    sink = RedisSnapshotSink.from_url(url, keys, ttl=10.0)
    assert isinstance(sink.client, RedisCluster)
    try:
        async with source_of(url, keys) as source:
            for waiting in (1, 2):
                # With polling once a minute, a version arrives through the subscription: its
                # announcement, or the refresh made once it is subscribed.
                version = await sink.publish(pool(keys.pool, pod("10.0.0.1:8000", waiting)))
                await eventually(lambda v=version: _version(source) == v)  # type: ignore[misc]
            snap = source.current()
            assert snap is not None
            assert (snap.pool, snap.pods[0].waiting) == (keys.pool, 2)
    finally:
        await sink.aclose()


async def test_sharing_replicas_merge_their_shards_on_a_cluster(cluster: LocalCluster) -> None:
    keys = RedisKeys("shared-on-cluster")
    client = redis_client(cluster.url)
    try:
        members: list[list[str]] = []
        for me in ("a", "b"):
            membership = Membership(client, keys, me=me, lease=5.0, on_members=members.append)
            members.append(await membership.renew())
        assert sorted(members[-1]) == ["a", "b"]
        await ShardSink(client, keys, me="a", ttl=5.0).publish(pool(keys.pool, pod("10.0.0.1:8000")))
        await ShardSink(client, keys, me="b", ttl=5.0).publish(pool(keys.pool, pod("10.0.0.2:8000")))
        async with source_of(cluster.url, keys) as source:
            await eventually(lambda: source.current() is not None)
            snap = source.current()
            assert snap is not None
            assert [p.address for p in snap.pods] == ["10.0.0.1:8000", "10.0.0.2:8000"]
    finally:
        await client.aclose()


async def test_cluster_true_reads_a_redis_url_as_a_start_node(cluster: LocalCluster) -> None:
    host, port = cluster.nodes[1].address
    config = parse_config({"redis": {"url": f"redis://{host}:{port}", "cluster": True}})
    assert config.redis.target == Cluster(nodes=((host, port),))
    client = redis_client(config.redis.target)
    try:
        assert isinstance(client, RedisCluster)
        for name in pool_on_each_node():  # every node reached from the one named
            await client.set(RedisKeys(name).sequence, 7)
            assert int(await client.get(RedisKeys(name).sequence)) == 7
    finally:
        await client.aclose()


def _version(source: RedisSnapshotSource) -> int:
    snap = source.current()
    return -1 if snap is None else snap.version


async def test_pickers_share_their_prefix_index_on_a_cluster(cluster: LocalCluster) -> None:
    """The stream has the pool's hash tag: on each node, two pickers' producers converge through it."""
    from pointsman_picker.prefix_sync import RedisPrefixSync
    from pointsman_picker.scheduling import CycleState, SchedulingRequest, Ticket
    from pointsman_picker.scheduling.assignments import POSITIONS
    from pointsman_picker.scheduling.prefix_cache import PREFIX_MATCH, PrefixCacheProducer

    pods = (pod("10.0.0.1:8000"), pod("10.0.0.2:8000"))
    request = SchedulingRequest("m", True, {"model": "m", "prompt": "A system prompt. " * 40})

    def state(producer: PrefixCacheProducer) -> CycleState:
        s = CycleState()
        s[POSITIONS] = {p.address: i for i, p in enumerate(pods)}
        producer.prepare(request, pods, s, 0.0)
        return s

    for name in pool_on_each_node():
        keys = RedisKeys(name)
        one, two = PrefixCacheProducer(auto_tune=False), PrefixCacheProducer(auto_tune=False)
        syncs = [
            RedisPrefixSync(cluster.url, keys, lambda p=p: [p], interval=0.01, backoff=FAST)
            for p in (one, two)
        ]
        for sync in syncs:
            await sync.start()
        try:
            one.picked(Ticket(1, "10.0.0.2:8000", 1.0), request, state(one))
            await eventually(lambda two=two: set(state(two)[PREFIX_MATCH].matched) == {"10.0.0.2:8000"})  # type: ignore[misc]
            assert all(s.failures == 0 for s in syncs)
        finally:
            for sync in syncs:
                await sync.aclose()
