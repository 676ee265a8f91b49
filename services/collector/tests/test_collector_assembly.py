"""The whole collector in-process, assembled by ``create_collector``: real pods, a real Redis, real HTTP.

What the command did in a child process only to assemble these parts runs here; the process boundary
itself (exit codes, signals, the console script) stays in test_collector_cli.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from kube_api import FakeApi, pod, recorded
from redis.asyncio import Redis

from pointsman_collector.assembly import (
    CollectorService,
    bind_listener,
    config_cluster_watch,
    create_collector,
)
from pointsman_collector.errors import DiscoveryError
from pointsman_collector.kubernetes.cluster_objects import PoolRef
from pointsman_collector.sink import SnapshotSink
from pointsman_collector.targets import StaticTargets
from pointsman_shared.codec import decode_pool
from pointsman_shared.config import PointsmanConfig, parse_config
from pointsman_shared.keys import RedisKeys
from pointsman_testkit import eventually


def config_of(doc: dict[str, Any]) -> PointsmanConfig:
    return parse_config(doc)


@contextlib.asynccontextmanager
async def serving(
    config: PointsmanConfig, **parts: Any
) -> AsyncIterator[tuple[CollectorService, httpx.AsyncClient]]:
    """The collector for the block, its HTTP surface on a free port, and a client for it."""
    service = create_collector(config, listen=bind_listener("127.0.0.1", 0), **parts)
    host, port = service.address
    async with service, httpx.AsyncClient(base_url=f"http://{host}:{port}") as client:
        yield service, client


async def pool_pods(client: httpx.AsyncClient) -> list[tuple[str, bool]] | None:
    response = await client.get("/v1/pool")
    if response.status_code != 200:
        return None
    return [(p["address"], p["healthy"]) for p in response.json()["pods"]]


async def test_serves_the_pool_and_follows_the_endpoints_file(
    tmp_path: Path, redis_url: str, pod_server, fixture_page
) -> None:  # type: ignore[no-untyped-def]
    pod_a = await pod_server(fixture_page("vllm-v0-lora"))
    added = await pod_server(fixture_page("vllm-current-lora"))
    endpoints = tmp_path / "endpoints.txt"
    endpoints.write_text("# the endpoints file starts empty\n")
    config = config_of(
        {
            "pool": {"name": "cli", "endpoints": [pod_a.address], "endpointsFile": str(endpoints)},
            "redis": {"url": redis_url},
        }
    )
    async with serving(config) as (service, client):

        async def ready() -> bool:
            return (await client.get("/readyz")).status_code == 200

        await eventually(ready, within=10.0, interval=0.05)
        body = (await client.get("/v1/pool")).json()
        assert body["pool"] == "cli"
        assert [(p["address"], p["healthy"], p["waiting"]) for p in body["pods"]] == [
            (pod_a.address, True, 3)
        ]
        # A pod added to the endpoints file joins the pool without a restart.
        endpoints.write_text(f"{added.address}\n")

        async def both() -> bool:
            return len((await client.get("/v1/pool")).json()["pods"]) == 2

        await eventually(both, within=10.0, interval=0.05)
        assert service.endpoints == (pod_a.address, added.address)
        # What the picker reads: the same pods in Redis.
        redis = Redis.from_url(redis_url)
        try:
            version, data = await redis.hmget(RedisKeys("cli").snapshot, ["version", "data"])
            assert {p.address for p in decode_pool(data, int(version)).pods} <= {pod_a.address, added.address}
        finally:
            await redis.aclose()
    assert service.collector.readiness() == "shutting down"


async def test_every_io_part_can_be_passed_in(pod_server, fixture_page, memory_sink) -> None:  # type: ignore[no-untyped-def]
    # No Redis at all: a sink in memory, a fixed clock, a target list of the test's own.
    model_server = await pod_server(fixture_page("vllm-no-lora"))
    sink = memory_sink
    config = config_of({"pool": {"name": "mem"}, "redis": {"url": "redis://127.0.0.1:1/0"}})
    targets = [StaticTargets((model_server.address,), name="test")]
    async with serving(config, sink=sink, targets=targets, clock=lambda: 1_764_000_000.0) as (_, client):
        published = await sink.wait_for(lambda pool: any(p.healthy for p in pool.pods))
        assert published.published_at == 1_764_000_000.0
        assert [(p.address, p.updated_at) for p in published.pods] == [
            (model_server.address, 1_764_000_000.0)
        ]
        assert await pool_pods(client) == [(model_server.address, True)]


async def test_an_unreadable_kubeconfig_is_a_discovery_error(
    tmp_path: Path, memory_sink: SnapshotSink
) -> None:
    config = config_of({"pool": {"kubernetes": {"kubeconfig": str(tmp_path / "absent")}}})
    # Raised before anything is made: the socket is still the caller's.
    with bind_listener("127.0.0.1", 0) as listen, pytest.raises(DiscoveryError, match="kubeconfig"):
        create_collector(config, sink=memory_sink, listen=listen)


async def test_the_collector_scrapes_the_pools_ready_pods(
    tmp_path: Path, redis_url: str, pod_server, fixture_page
) -> None:  # type: ignore[no-untyped-def]
    model_server = await pod_server(fixture_page("vllm-v0-lora"))
    pool = recorded("inferencepool-v1")  # the default pool.kubernetes.apiVersion
    pool["spec"]["targetPorts"] = [{"number": model_server.port}]
    api = await FakeApi(pool).start()
    api.put_pod(pod("a", "127.0.0.1"), "ADDED")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"current-context: local\nclusters:\n- name: c\n  cluster: {{server: '{api.url}'}}\n"
        "users:\n- name: u\n  user: {token: t0ken}\n"
        "contexts:\n- name: local\n  context: {cluster: c, user: u, namespace: default}\n"
    )
    config = config_of(
        {
            "pool": {"name": pool["metadata"]["name"], "kubernetes": {"kubeconfig": str(kubeconfig)}},
            "redis": {"url": redis_url},
        }
    )
    try:
        async with serving(config) as (_, client):

            def until(expected: list[tuple[str, bool]]) -> Callable[[], Awaitable[bool]]:
                async def check() -> bool:
                    return await pool_pods(client) == expected

                return check

            # The first list came before scraping started: the first publish has the pod already.
            await eventually(until([(model_server.address, True)]), within=10.0, interval=0.05)
            await api.watched()
            api.put_pod(pod("a", "127.0.0.1", ready=False))
            await eventually(until([]), within=10.0, interval=0.05)
    finally:
        await api.aclose()


async def test_sharing_replicas_split_the_pool_and_publish_it_whole(
    redis_url: str, pod_server, fixture_page
) -> None:  # type: ignore[no-untyped-def]
    pods = [await pod_server(fixture_page("vllm-current-lora")) for _ in range(4)]
    config = config_of(
        {
            "pool": {"name": "shared", "endpoints": [p.address for p in pods]},
            "redis": {"url": redis_url},
            "collector": {"sharing": True, "leaseTtl": "300ms"},
        }
    )
    redis = Redis.from_url(redis_url)
    try:
        async with serving(config, me="a") as (a, _), serving(config, me="b") as (b, _):

            async def split() -> bool:
                owned = [
                    s.registry.get_sample_value("pointsman_collector_owned_pods", {"pool": "shared"})
                    for s in (a, b)
                ]
                return sum(o or 0 for o in owned) == len(pods) and all(p.open_connections == 1 for p in pods)

            async def whole() -> bool:
                version, data = await redis.hmget(RedisKeys("shared").snapshot, ["version", "data"])
                if data is None:
                    return False
                snapshot = decode_pool(data, int(version))
                return sorted(p.address for p in snapshot.pods if p.healthy) == sorted(
                    p.address for p in pods
                )

            await eventually(split, within=10.0, interval=0.05)
            await eventually(whole, within=10.0, interval=0.05)
        # Both left the member set on the way out.
        assert await redis.zcard(RedisKeys("shared").members) == 0
    finally:
        await redis.aclose()


@pytest.mark.parametrize(
    ("pool", "picker", "pool_ref"),
    [
        ({"kubernetes": {"inferencePool": "p"}}, {}, PoolRef("p", "inference.networking.k8s.io")),
        (
            {"kubernetes": {"apiVersion": "inference.networking.x-k8s.io/v1alpha2"}},
            {"clusterObjects": "cluster"},
            PoolRef("default-pool", "inference.networking.x-k8s.io"),
        ),
        ({"kubernetes": {}}, {"clusterObjects": "config"}, None),  # the pickers would not read them
        ({"endpoints": ["10.0.0.1:8000"]}, {}, None),  # no Kubernetes to watch
    ],
)
def test_the_cluster_objects_are_watched_for_a_kubernetes_pool_whose_pickers_read_them(
    pool: dict[str, Any], picker: dict[str, Any], pool_ref: PoolRef | None, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "current-context: c\nclusters:\n- name: c\n  cluster: {server: 'http://127.0.0.1:1'}\n"
        "contexts:\n- name: c\n  context: {cluster: c, namespace: ns}\n"
    )
    if "kubernetes" in pool:
        pool["kubernetes"]["kubeconfig"] = str(kubeconfig)
    watch = config_cluster_watch(config_of({"pool": pool, "picker": picker}), {})
    assert (watch.pool if watch is not None else None) == pool_ref
