"""app.py through ASGI: probes, metrics, the pool as JSON."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client import CollectorRegistry, Gauge

from pointsman_collector.app import create_app
from pointsman_shared.snapshot import PodSnapshot, PoolSnapshot


class View:
    def __init__(self) -> None:
        self.published: PoolSnapshot | None = None
        self.reason: str | None = "no snapshot published yet"

    def readiness(self) -> str | None:
        return self.reason


@pytest.fixture
def view() -> View:
    return View()


@pytest.fixture
async def client(view: View) -> AsyncIterator[httpx.AsyncClient]:
    registry = CollectorRegistry()
    Gauge("probe_gauge", "A series to find on /metrics.", registry=registry).set(7)
    app = create_app(view, registry=registry)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://collector"
    ) as client:
        yield client


async def test_healthz_answers_while_alive(client: httpx.AsyncClient) -> None:
    response = await client.get("/healthz")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


@pytest.mark.parametrize(
    ("reason", "status", "body"),
    [
        (None, 200, {"status": "ready"}),
        ("no snapshot published yet", 503, {"status": "not ready", "reason": "no snapshot published yet"}),
        (
            "cannot publish to redis (connection)",
            503,
            {"status": "not ready", "reason": "cannot publish to redis (connection)"},
        ),
    ],
)
async def test_readyz(
    client: httpx.AsyncClient, view: View, reason: str | None, status: int, body: object
) -> None:
    view.reason = reason
    response = await client.get("/readyz")
    assert (response.status_code, response.json()) == (status, body)


async def test_metrics_serves_the_registry(client: httpx.AsyncClient) -> None:
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert "probe_gauge 7.0" in response.text


async def test_pool_shows_the_published_snapshot(client: httpx.AsyncClient, view: View) -> None:
    assert (await client.get("/v1/pool")).status_code == 503
    view.published = PoolSnapshot(
        pool="p",
        version=9,
        published_at=1_764_000_000.5,
        pods=(
            PodSnapshot(
                address="10.0.0.1:8000",
                waiting=1,
                running=2,
                kv_cache_usage=0.5,
                prefix_cache_hit_rate=0.25,
                block_size=16,
                num_gpu_blocks=27000,
                max_lora=4,
                running_adapters=frozenset({"b", "a"}),
                waiting_adapters=frozenset({"c"}),
                updated_at=1_764_000_000.25,
            ),
        ),
    )
    response = await client.get("/v1/pool")
    assert response.status_code == 200
    assert response.json() == {
        "pool": "p",
        "version": 9,
        "publishedAt": 1_764_000_000.5,
        "pods": [
            {
                "address": "10.0.0.1:8000",
                "waiting": 1,
                "running": 2,
                "kvCacheUsage": 0.5,
                "prefixCacheHitRate": 0.25,
                "blockSize": 16,
                "numGpuBlocks": 27000,
                "maxLora": 4,
                "runningAdapters": ["a", "b"],
                "waitingAdapters": ["c"],
                "activeAdapters": ["a", "b", "c"],
                "updatedAt": 1_764_000_000.25,
                "healthy": True,
                "reason": "",
                "fieldTimes": {"waiting": 0.0, "running": 0.0, "kv": 0.0, "lora": 0.0},
            }
        ],
    }
