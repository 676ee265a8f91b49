"""The cluster objects' writes to a real Redis (cluster_sink)."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis

from pointsman_collector.cluster_sink import ClusterSink
from pointsman_collector.sink import redis_client
from pointsman_shared.cluster import ClusterObjective, ClusterObjects
from pointsman_shared.cluster_codec import decode_cluster, encode_cluster, stamp
from pointsman_shared.keys import RedisKeys
from pointsman_testkit import eventually

KEYS = RedisKeys("p")
SET = ClusterObjects(objectives=(ClusterObjective("batch", "llm-d.ai/v1alpha2", 2, -1),))


async def messages(pubsub: Any, seconds: float) -> list[bytes]:
    """The messages heard within ``seconds`` (the subscription's confirmation left out)."""
    heard: list[bytes] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (left := deadline - loop.time()) > 0:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
        if message is not None:
            heard.append(message["data"])
    return heard


async def test_a_new_set_is_written_with_a_notification_and_rewritten_without(redis_url: str) -> None:
    reader = aioredis.Redis.from_url(redis_url)
    client = redis_client(redis_url)
    pubsub = reader.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(KEYS.channel)
    sink = ClusterSink(client, KEYS)
    try:
        sink.set(SET)
        assert await sink.write()
        got_stamp, data = await reader.hmget(KEYS.cluster, ["stamp", "data"])
        assert decode_cluster(data) == SET
        assert got_stamp.decode() == stamp(encode_cluster(SET))
        assert await messages(pubsub, 1.0) == [f"cluster {got_stamp.decode()}".encode()]
        # The same set again (the periodic rewrite): written, not announced.
        await reader.delete(KEYS.cluster)
        assert await sink.write()
        assert await reader.hmget(KEYS.cluster, ["stamp"]) == [got_stamp]
        assert await messages(pubsub, 0.3) == []
    finally:
        await pubsub.aclose()
        await reader.aclose()
        await client.aclose()


async def test_a_failed_write_is_counted_and_retried_by_the_loop(redis_url: str) -> None:
    errors: list[str] = []
    dead = redis_client("redis://127.0.0.1:1")  # nothing listens on port 1
    sink = ClusterSink(dead, KEYS, on_error=errors.append, rewrite=0.01)
    sink.set(SET)
    assert not await sink.write()
    assert errors == ["connection"]
    task = asyncio.create_task(sink.run())
    try:
        await eventually(lambda: len(errors) >= 3, within=10.0)  # retried without a change
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await dead.aclose()
    assert sink.writes == 0
