"""Following a pool with list/watch (``kubernetes/watch.py``) against a local fake API server."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kube_api import ALPHA2, V1, FakeApi, pod, recorded

from pointsman_collector.kubernetes.credentials import KubeAccess
from pointsman_collector.kubernetes.watch import RETRY, KubernetesTargets
from pointsman_shared.backoff import Backoff


class Seen:
    """The endpoint sets ``on_change`` was called with, and a way to wait for one."""

    def __init__(self) -> None:
        self.sets: list[tuple[str, ...]] = []
        self._changed = asyncio.Event()

    def __call__(self, endpoints: tuple[str, ...]) -> None:
        self.sets.append(endpoints)
        self._changed.set()

    async def until(self, expected: tuple[str, ...]) -> None:
        async with asyncio.timeout(5):
            while not self.sets or self.sets[-1] != expected:
                self._changed.clear()
                await self._changed.wait()


@pytest.fixture
async def follow() -> AsyncIterator[Any]:
    started: list[tuple[FakeApi, asyncio.Task[None]]] = []

    async def start(
        pool: dict[str, Any], pods: list[dict[str, Any]], api_version: str | None = None
    ) -> tuple[FakeApi, Seen]:
        """Follow ``pool`` as the version it is (or as ``api_version``) in a fake API serving it."""
        api = await FakeApi(pool).start()
        for p in pods:
            api.put_pod(p, "ADDED")
        seen = Seen()
        access = KubeAccess(server=api.url, namespace="default", token="t0ken")
        targets = KubernetesTargets(
            access,
            pool=pool["metadata"]["name"],
            api_version=api_version or pool["apiVersion"],
            on_change=seen,
            backoff=Backoff(initial=0.01, maximum=0.05),
        )
        started.append((api, asyncio.create_task(targets.run())))
        return api, seen

    yield start
    for api, task in started:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.aclose()


# --- following a pool -----------------------------------------------------------------------------


async def test_ready_pods_join_and_leave_as_they_change(follow) -> None:
    api, seen = await follow(
        recorded("inferencepool-v1alpha2"),
        [
            pod("a", "10.0.0.1"),
            pod("b", "10.0.0.2", ready=False),
            pod("x", "10.0.0.9", labels={"app": "other"}),
        ],
    )
    await seen.until(("10.0.0.1:8000",))
    path, query, auth = api.requests[1]
    assert (path, query["labelSelector"], auth) == (
        "/api/v1/namespaces/default/pods",
        "app=vllm-llama3-8b-instruct",
        "Bearer t0ken",
    )
    await api.watched()
    api.put_pod(pod("b", "10.0.0.2"))  # turned Ready
    await seen.until(("10.0.0.1:8000", "10.0.0.2:8000"))
    api.put_pod(pod("b", "10.0.0.2", ready=False))
    await seen.until(("10.0.0.1:8000",))
    api.put_pod(pod("b", "10.0.0.2"))
    await seen.until(("10.0.0.1:8000", "10.0.0.2:8000"))
    api.put_pod(pod("c", None), "ADDED")  # scheduled, no IP yet
    api.delete_pod("a")
    await seen.until(("10.0.0.2:8000",))
    api.put_pod(pod("b", "10.0.0.2", labels={"app": "elsewhere"}))  # relabelled: no longer in the pool
    await seen.until(())


async def test_a_selector_change_relists_the_pods(follow) -> None:
    pool = recorded("inferencepool-v1alpha2")
    api, seen = await follow(pool, [pod("a", "10.0.0.1"), pod("z", "10.0.0.7", labels={"app": "new"})])
    await seen.until(("10.0.0.1:8000",))
    await api.watched()
    pool["spec"]["selector"] = {"app": "new"}
    pool["spec"]["targetPortNumber"] = 9000
    api.put_pool(pool)
    await seen.until(("10.0.0.7:9000",))
    assert any(q.get("labelSelector") == "app=new" and "watch" not in q for _, q, _ in api.requests)


async def test_an_expired_watch_relists(follow) -> None:
    api, seen = await follow(recorded("inferencepool-v1alpha2"), [pod("a", "10.0.0.1")])
    await seen.until(("10.0.0.1:8000",))
    await api.watched()
    lists = sum("watch" not in q for p, q, _ in api.requests if p.endswith("/pods"))
    api.pods["b"] = pod("b", "10.0.0.2")  # a change the expired watch never delivered
    api.pods["b"]["metadata"]["resourceVersion"] = "1"
    api.expire("pods")
    await seen.until(("10.0.0.1:8000", "10.0.0.2:8000"))
    assert sum("watch" not in q for p, q, _ in api.requests if p.endswith("/pods")) == lists + 1


async def test_an_odd_event_restarts_from_a_fresh_list(follow) -> None:
    api, seen = await follow(recorded("inferencepool-v1alpha2"), [pod("a", "10.0.0.1")])
    await seen.until(("10.0.0.1:8000",))
    await api.watched()
    api.send_raw("pods", {"type": "MODIFIED", "object": ["not", "a", "pod"]})
    api.pods["b"] = pod("b", "10.0.0.2")  # listed on the restart
    api.pods["b"]["metadata"]["resourceVersion"] = "1"
    await seen.until(("10.0.0.1:8000", "10.0.0.2:8000"))


# --- the API versions ------------------------------------------------------------------------------

V1_POOL = f"/apis/{V1}/namespaces/default/inferencepools"
ALPHA2_POOL = f"/apis/{ALPHA2}/namespaces/default/inferencepools"
PODS = "/api/v1/namespaces/default/pods"


def _calls(api: FakeApi) -> list[tuple[str, str]]:
    """Each request as (path, "get" | "list" | "watch")."""
    collections = (V1_POOL, ALPHA2_POOL, PODS)
    return [
        (path, "watch" if query.get("watch") == "1" else "list" if path in collections else "get")
        for path, query, _ in api.requests
    ]


async def test_a_v1_pool_makes_each_ready_pod_an_endpoint_on_every_target_port(follow) -> None:
    # targetPorts 8000 and 8001 (data-parallel ranks): two endpoints per Ready pod.
    pods = [pod("a", "10.0.0.1"), pod("b", "10.0.0.2"), pod("c", "10.0.0.3", ready=False)]
    api, seen = await follow(recorded("inferencepool-v1"), pods)
    await seen.until(("10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000", "10.0.0.2:8001"))
    await api.watched()
    calls = _calls(api)
    assert calls[:2] == [(f"{V1_POOL}/vllm-llama3-8b-instruct", "get"), (PODS, "list")]
    assert {(V1_POOL, "watch"), (PODS, "watch")} <= set(calls)
    (pool_watch,) = [q for p, q, _ in api.requests if p == V1_POOL]
    assert pool_watch["fieldSelector"] == "metadata.name=vllm-llama3-8b-instruct"
    assert pool_watch["resourceVersion"] == "51230"  # the GET's: no change between the two is missed
    api.put_pod(pod("c", "10.0.0.3"))  # turned Ready: both its ports join
    await seen.until(tuple(f"10.0.0.{i}:{port}" for i in (1, 2, 3) for port in (8000, 8001)))


async def test_a_v1alpha2_pool_is_read_at_its_own_group_and_version(follow) -> None:
    api, seen = await follow(recorded("inferencepool-v1alpha2"), [pod("a", "10.0.0.1"), pod("b", "10.0.0.2")])
    await seen.until(("10.0.0.1:8000", "10.0.0.2:8000"))
    await api.watched()
    calls = _calls(api)
    assert calls[:2] == [(f"{ALPHA2_POOL}/vllm-llama3-8b-instruct", "get"), (PODS, "list")]
    assert {(ALPHA2_POOL, "watch"), (PODS, "watch")} <= set(calls)


async def test_a_v1_pool_changing_its_ports_during_the_watch_moves_the_endpoints(follow) -> None:
    api, seen = await follow(recorded("inferencepool-v1"), [pod("a", "10.0.0.1"), pod("b", "10.0.0.2")])
    await seen.until(("10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000", "10.0.0.2:8001"))
    await api.watched()
    lists = _calls(api).count((PODS, "list"))
    event = recorded("inferencepool-v1-ports-changed")  # targetPorts 8000, 8002, 8003
    assert event["type"] == "MODIFIED"
    api.put_pool(event["object"])
    await seen.until(tuple(f"10.0.0.{i}:{port}" for i in (1, 2) for port in (8000, 8002, 8003)))
    assert _calls(api).count((PODS, "list")) == lists + 1  # re-listed under the new spec
    # The pool's watch goes on from the event's version, not from the first GET's.
    assert api.pool is not None
    changed = api.pool["metadata"]["resourceVersion"]
    await api.requested(lambda path, query: path == V1_POOL and query["resourceVersion"] == changed)
    event["object"]["spec"]["targetPorts"] = [{"number": 9000}]
    api.put_pool(event["object"])
    await seen.until(("10.0.0.1:9000", "10.0.0.2:9000"))


async def test_a_pool_asked_for_at_another_version_is_not_found_and_retried(follow) -> None:
    # A v1-only cluster (GIE v1.5+) and a collector configured for v1alpha2: 404, never synced.
    api, seen = await follow(recorded("inferencepool-v1"), [pod("a", "10.0.0.1")], api_version=ALPHA2)
    await api.requested(lambda _path, _query: True, count=3)
    assert {path for path, _ in _calls(api)} == {f"{ALPHA2_POOL}/vllm-llama3-8b-instruct"}
    assert seen.sets == []


async def test_a_missing_pool_is_retried_until_it_appears(follow) -> None:
    pool = recorded("inferencepool-v1alpha2")
    api, seen = await follow(pool, [pod("a", "10.0.0.1")])
    await seen.until(("10.0.0.1:8000",))
    await api.watched()
    api.delete_pool()
    await seen.until(())
    api.create_pool(pool)  # nobody watches it now: found by the retried GET
    await seen.until(("10.0.0.1:8000",))


async def test_follow_reports_the_first_list_even_when_it_is_empty() -> None:
    # The collector's start waits for each source's first set: an empty pool must not make it wait.
    api = await FakeApi(recorded("inferencepool-v1alpha2")).start()
    seen = Seen()
    access = KubeAccess(server=api.url, namespace="default")
    targets = KubernetesTargets(access, pool="vllm-llama3-8b-instruct", api_version=ALPHA2)
    task = asyncio.create_task(targets.follow(seen))
    try:
        await seen.until(())
        assert targets.synced.is_set()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.aclose()


def test_retries_back_off_from_half_a_second_doubling_to_ten() -> None:
    # As docs/collector.md says; without jitter the random source is not used.
    assert [RETRY.delay(n, random.Random()) for n in range(1, 8)] == [0.5, 1, 2, 4, 8, 10, 10]
