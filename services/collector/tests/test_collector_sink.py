"""RedisSnapshotSink against a real Redis: the contract the picker reads (docs/redis-schema.md)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from pointsman_collector.errors import PublishError
from pointsman_collector.sink import (
    PUBLISH_RETRIES,
    PUBLISH_RETRY,
    RedisSnapshotSink,
    RetryBackoff,
    redis_client,
)
from pointsman_devstack.ports import free_port
from pointsman_shared.codec import decode_pool
from pointsman_shared.config import CollectorConfig
from pointsman_shared.keys import RedisKeys
from pointsman_shared.snapshot import PodSnapshot, PoolSnapshot

KEYS = RedisKeys("pool-a")


def pool(*pods: PodSnapshot) -> PoolSnapshot:
    return PoolSnapshot(pool="pool-a", version=0, published_at=1_764_000_000.5, pods=pods)


POD = PodSnapshot(
    address="10.0.0.1:8000",
    waiting=2,
    running=3,
    kv_cache_usage=0.25,
    max_lora=4,
    running_adapters=frozenset({"a"}),
    waiting_adapters=frozenset({"b"}),
    updated_at=1_764_000_000.25,
)


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def sink(redis_url: str) -> AsyncIterator[RedisSnapshotSink]:
    sink = RedisSnapshotSink.from_url(redis_url, KEYS, ttl=10.0)
    yield sink
    await sink.aclose()


async def read(client: Redis) -> PoolSnapshot:
    """What the picker does."""
    version, data = await client.hmget(KEYS.snapshot, ["version", "data"])
    return decode_pool(data, int(version))


async def test_publish_writes_version_and_data_together(sink: RedisSnapshotSink, client: Redis) -> None:
    assert await sink.publish(pool(POD)) == 1
    assert await read(client) == PoolSnapshot("pool-a", 1, 1_764_000_000.5, (POD,))
    assert await sink.publish(pool()) == 2
    assert await read(client) == PoolSnapshot("pool-a", 2, 1_764_000_000.5, ())


async def test_the_snapshot_expires_and_the_sequence_does_not(sink: RedisSnapshotSink, client: Redis) -> None:
    await sink.publish(pool(POD))
    assert 9_000 < await client.pttl(KEYS.snapshot) <= 10_000
    assert await client.ttl(KEYS.sequence) == -1
    await client.delete(KEYS.snapshot)
    assert await sink.publish(pool(POD)) == 2  # versions keep growing when the snapshot expired


async def test_each_publish_is_announced_with_its_version(sink: RedisSnapshotSink, client: Redis) -> None:
    pubsub = client.pubsub()
    try:
        await pubsub.subscribe(KEYS.channel)
        assert (await pubsub.get_message(timeout=1.0))["type"] == "subscribe"
        await sink.publish(pool(POD))
        await sink.publish(pool(POD))
        messages = [await pubsub.get_message(timeout=1.0) for _ in range(2)]
    finally:
        await pubsub.aclose()
    assert [m["data"] for m in messages] == [b"1", b"2"]


async def test_publish_survives_a_flushed_script_cache(sink: RedisSnapshotSink, client: Redis) -> None:
    await sink.publish(pool(POD))
    await client.script_flush()
    assert await sink.publish(pool(POD)) == 2


async def test_an_unreachable_redis_is_a_publish_error() -> None:
    sink = RedisSnapshotSink.from_url(f"redis://127.0.0.1:{free_port()}/0", KEYS, ttl=10.0)
    try:
        with pytest.raises(PublishError) as excinfo:
            await sink.publish(pool(POD))
    finally:
        await sink.aclose()
    assert excinfo.value.reason == "connection"


async def test_publishing_resumes_when_redis_is_back(redis_proxy) -> None:  # type: ignore[no-untyped-def]
    proxy, url = redis_proxy
    sink = RedisSnapshotSink.from_url(url, KEYS, ttl=10.0)
    try:
        assert await sink.publish(pool(POD)) == 1
        await proxy.cut()
        with pytest.raises(PublishError) as excinfo:
            await sink.publish(pool(POD))
        assert excinfo.value.reason == "connection"
        await proxy.start()
        assert await sink.publish(pool(POD)) == 2
    finally:
        await sink.aclose()


async def test_the_clients_retries_sleep_as_the_shared_backoff_says_and_fit_the_staleness_budget() -> None:
    client = redis_client("redis://127.0.0.1:1/0", rng=random.Random(5))
    try:
        retry = client.get_retry()
        assert retry is not None
        backoff = retry._backoff  # redis-py keeps it private
        assert isinstance(backoff, RetryBackoff)
        # redis-py counts failures from 1: 40 ms, then 80 ms, fully jittered.
        assert [PUBLISH_RETRY.ceiling(n) for n in range(1, PUBLISH_RETRIES + 1)] == [0.04, 0.08]
        assert all(0 <= backoff.compute(n) <= PUBLISH_RETRY.ceiling(n) for n in range(1, 10))
        worst = sum(PUBLISH_RETRY.ceiling(n) for n in range(1, PUBLISH_RETRIES + 1))
        assert PUBLISH_RETRY.maximum < CollectorConfig().staleness
        assert worst < CollectorConfig().staleness / 10
    finally:
        await client.aclose()
