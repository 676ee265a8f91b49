"""The collector end to end: fake pods over real HTTP, a real Redis, the HTTP surface through ASGI."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from pointsman_collector.app import create_app
from pointsman_collector.loop import Collector
from pointsman_collector.sink import RedisSnapshotSink
from pointsman_shared.codec import decode_pool
from pointsman_shared.config import parse_config
from pointsman_shared.keys import RedisKeys
from pointsman_shared.snapshot import PodSnapshot, PoolSnapshot

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "tests" / "data" / "vllm-metrics"
KEYS = RedisKeys("e2e")


@dataclass
class Stack:
    collector: Collector
    http: httpx.AsyncClient
    redis: Redis

    async def read(self) -> PoolSnapshot | None:
        """What the picker reads."""
        version, data = await self.redis.hmget(KEYS.snapshot, ["version", "data"])
        return None if version is None else decode_pool(data, int(version))

    async def readyz(self, predicate: Callable[[int], bool]) -> httpx.Response:
        async with asyncio.timeout(5.0):
            while True:
                response = await self.http.get("/readyz")
                if predicate(response.status_code):
                    return response
                await asyncio.sleep(0.05)

    async def until(self, predicate: Callable[[dict[str, PodSnapshot]], bool]) -> PoolSnapshot:
        async with asyncio.timeout(5.0):
            while True:
                snapshot = await self.read()
                if snapshot is not None and predicate({p.address: p for p in snapshot.pods}):
                    return snapshot
                await asyncio.sleep(0.02)


@pytest.fixture
async def stack(redis_url: str) -> AsyncIterator[Callable[[list[str], str], Awaitable[Stack]]]:
    started: list[tuple[Collector, RedisSnapshotSink, httpx.AsyncClient, Redis]] = []

    async def start(endpoints: list[str], url: str = redis_url) -> Stack:
        config = parse_config(
            {
                "pool": {"name": "e2e", "endpoints": endpoints},
                "redis": {"url": url},
                "collector": {"interval": "20ms", "timeout": "300ms", "snapshotTtl": "5s"},
            }
        )
        registry = CollectorRegistry()
        sink = RedisSnapshotSink.from_url(config.redis.url, KEYS, ttl=config.collector.snapshot_ttl)
        collector = Collector.from_config(config, sink=sink, registry=registry)
        app = create_app(collector, registry=registry)
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://collector")
        redis = Redis.from_url(redis_url)
        started.append((collector, sink, http, redis))
        collector.start(config.pool.endpoints)
        return Stack(collector, http, redis)

    yield start
    for collector, sink, http, redis in started:
        await collector.stop()
        await sink.aclose()
        await http.aclose()
        await redis.aclose()


def expected(name: str) -> dict[str, object]:
    return json.loads((FIXTURES / f"{name}.expected.json").read_text())


def as_expected(pod: PodSnapshot) -> dict[str, object]:
    return {
        "waiting": pod.waiting,
        "running": pod.running,
        "kv_cache_usage": pod.kv_cache_usage,
        "max_lora": pod.max_lora,
        "running_adapters": sorted(pod.running_adapters),
        "waiting_adapters": sorted(pod.waiting_adapters),
        "active_adapters": sorted(pod.active_adapters),
        "block_size": pod.block_size,
        "num_gpu_blocks": pod.num_gpu_blocks,
    }


async def test_pods_reach_redis_and_the_http_surface(stack, pod_server, fixture_page) -> None:
    a = await pod_server(fixture_page("vllm-v0-lora"))
    b = await pod_server(fixture_page("vllm-current-lora"), chunk_size=2048)
    s = await stack([a.address, b.address])

    snapshot = await s.until(lambda pods: len(pods) == 2 and all(p.healthy for p in pods.values()))
    pods = {p.address: p for p in snapshot.pods}
    for server, name in ((a, "vllm-v0-lora"), (b, "vllm-current-lora")):
        want = {k: v for k, v in expected(name).items() if k != "note"}
        assert as_expected(pods[server.address]) == want
    assert snapshot.pool == "e2e"
    assert 0 < await s.redis.pttl(KEYS.snapshot) <= 5000
    assert a.connections == 1  # one kept-alive connection per pod

    response = await s.http.get("/v1/pool")
    body = response.json()
    assert response.status_code == 200
    assert body["pool"] == "e2e"
    assert body["version"] >= snapshot.version
    assert sorted(p["address"] for p in body["pods"]) == sorted([a.address, b.address])
    by_address = {p["address"]: p for p in body["pods"]}
    assert by_address[a.address]["activeAdapters"] == ["sql-lora", "tweet-summary-0", "tweet-summary-1"]
    assert (await s.http.get("/readyz")).status_code == 200
    metrics = (await s.http.get("/metrics")).text
    assert f'pointsman_pod_waiting_requests{{pod="{a.address}",pool="e2e"}} 3.0' in metrics
    assert 'inference_pool_ready_pods{name="e2e"} 2.0' in metrics

    # A pod that starts failing is published unhealthy after three scrapes; the other is untouched.
    b.serve("", status=500)
    await s.until(lambda pods: pods[b.address].reason == "http_status" and pods[a.address].healthy)
    b.serve(fixture_page("vllm-current-lora"))
    await s.until(lambda pods: pods[b.address].healthy)


async def test_readiness_follows_redis(stack, pod_server, fixture_page, redis_proxy) -> None:
    proxy, url = redis_proxy
    pod = await pod_server(fixture_page("vllm-no-lora"))
    s = await stack([pod.address], url)
    await s.until(lambda pods: pods[pod.address].healthy)
    assert (await s.http.get("/readyz")).status_code == 200

    await proxy.cut()
    response = await s.readyz(lambda status: status == 503)
    assert response.json()["reason"] == "cannot publish to redis (connection)"
    await proxy.start()
    await s.readyz(lambda status: status == 200)
