"""InferenceObjectives and InferenceModelRewrites applied in the cluster, followed by every picker.

The real collector watches a local Kubernetes API (``pointsman_testkit.kube``: the CRDs' real schemas,
RBAC, CRDs installed or not) and publishes to a real Redis; two real pickers read it. The pickers poll
only once a minute here, so a change they follow in a test came with the collector's notification on
publish, not with a poll.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from pointsman_collector.assembly import CollectorService, bind_listener, create_collector
from pointsman_collector.kubernetes import KubeAccess
from pointsman_collector.kubernetes.cluster_objects import PoolRef
from pointsman_collector.kubernetes.cluster_watch import ClusterObjectsWatch
from pointsman_collector.targets import StaticTargets
from pointsman_devstack.redis_server import RedisServer, start_redis
from pointsman_picker.context import RequestContext
from pointsman_picker.resolution import Resolution
from pointsman_picker.server import PickerApp, create_app
from pointsman_picker.snapshots import RedisSnapshotSource
from pointsman_shared.backoff import Backoff
from pointsman_shared.config import parse_config
from pointsman_shared.keys import RedisKeys
from pointsman_testkit import eventually
from pointsman_testkit.kube import Crd, KubeApi, Permission, read_crds

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parents[1] / "deploy" / "data"
GIE = read_crds(*(DATA / "gie-crds/v1.5.0").glob("inference.networking.x-k8s.io_inference[om]*.yaml"))
LLM_D = read_crds(*(DATA / "llm-d-crds").glob("*.yaml"))
POOL = "pool"
GIE_V = "inference.networking.x-k8s.io/v1alpha2"
LLM_D_V = "llm-d.ai/v1alpha2"
FAST = Backoff(initial=0.02, maximum=0.1)


def objective(name: str, priority: int | None, api_version: str = GIE_V, pool: str = POOL) -> dict[str, Any]:
    spec: dict[str, Any] = {"poolRef": {"name": pool}}
    if priority is not None:
        spec["priority"] = priority
    return {"apiVersion": api_version, "kind": "InferenceObjective", "metadata": {"name": name}, "spec": spec}


def rewrite(
    name: str, model: str | None, *targets: tuple[str, int | None], api_version: str = GIE_V
) -> dict[str, Any]:
    rule: dict[str, Any] = {
        "targets": [{"modelRewrite": t} | ({"weight": w} if w is not None else {}) for t, w in targets]
    }
    if model is not None:
        rule["matches"] = [{"model": {"value": model}}]
    return {
        "apiVersion": api_version,
        "kind": "InferenceModelRewrite",
        "metadata": {"name": name},
        "spec": {"poolRef": {"name": POOL}, "rules": [rule]},
    }


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    server = start_redis({}, allow_docker=False)  # a local one: the outage test kills and restarts it
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def kube() -> AsyncIterator[KubeApi]:
    api = await KubeApi().start()
    try:
        yield api
    finally:
        await api.aclose()


@asynccontextmanager
async def running(
    redis_url: str, kube: KubeApi, *, pickers: int = 2, sources: str = "both", seed: int = 0
) -> AsyncIterator[tuple[CollectorService, ClusterObjectsWatch, list[PickerApp]]]:
    """A collector watching ``kube``'s objects of the pool and ``pickers`` pickers reading Redis."""
    config = parse_config(
        {
            "pool": {"name": POOL},
            "redis": {"url": redis_url},
            "picker": {"clusterObjects": sources},
            "models": [{"modelName": "configured", "targetModels": [{"name": "configured-v1"}]}],
            "objectives": [{"name": "clash", "priority": 7}],
        }
    )
    watch = ClusterObjectsWatch(
        KubeAccess(server=kube.url, namespace="default"), pool=PoolRef(POOL), backoff=FAST
    )
    collector = create_collector(
        config, targets=[StaticTargets(())], cluster=watch, listen=bind_listener("127.0.0.1", 0)
    )
    apps = [
        create_app(
            config,
            source=RedisSnapshotSource(redis_url, RedisKeys(POOL), poll_interval=60.0, backoff=FAST),
            rng=random.Random(seed + i),
        )
        for i in range(pickers)
    ]
    async with collector:
        for app in apps:
            await app.source.start()
        try:
            yield collector, watch, apps
        finally:
            for app in apps:
                await app.source.aclose()


def resolve(app: PickerApp, model: str, objective: str | None = None) -> Resolution:
    body = b'{"model":"%s","prompt":"hi"}' % model.encode()
    resolved = app.director.resolve(RequestContext("r", body, objective=objective))
    assert resolved.resolution is not None
    return resolved.resolution


async def every_picker(apps: list[PickerApp], check: Any) -> None:
    async def all_follow() -> bool:
        return all(check(app) for app in apps)

    await eventually(all_follow, within=10.0, interval=0.02)


async def pool_view(collector: CollectorService) -> dict[str, Any]:
    host, port = collector.address
    async with httpx.AsyncClient() as client:
        body: dict[str, Any] = (await client.get(f"http://{host}:{port}/v1/pool")).json()
    return body


def sample(collector: CollectorService, metric: str, **labels: str) -> float | None:
    return collector.registry.get_sample_value(metric, labels)


async def test_every_picker_follows_objects_created_changed_and_deleted(
    redis: RedisServer, kube: KubeApi
) -> None:
    kube.install(GIE)
    async with running(redis.url, kube) as (_collector, _, apps):
        kube.create(objective("batch", -1))
        await every_picker(apps, lambda a: resolve(a, "m", "batch").priority == -1)
        first = resolve(apps[0], "m", "batch")
        assert (first.critical, first.objective) == (False, "cluster/batch")

        kube.replace(objective("batch", 5))
        await every_picker(apps, lambda a: resolve(a, "m", "batch").priority == 5)

        kube.create(rewrite("canary", "m", ("m-v2", None)))
        await every_picker(apps, lambda a: resolve(a, "m").target == "m-v2")
        assert resolve(apps[1], "m").rewrite == "cluster/canary"

        kube.delete(objective("batch", None))
        await every_picker(apps, lambda a: resolve(a, "m", "batch").priority == 0)
        assert resolve(apps[0], "m", "batch").objective == ""

        # Each object of the pool got an Accepted condition for its generation.
        stored = kube.get(rewrite("canary", None))
        (condition,) = stored["status"]["conditions"]
        assert (condition["type"], condition["status"], condition["observedGeneration"]) == (
            "Accepted",
            "True",
            1,
        )


async def test_an_invalid_object_is_refused_with_its_reason_and_the_rest_apply(
    redis: RedisServer, kube: KubeApi
) -> None:
    kube.install(GIE)
    async with running(redis.url, kube) as (collector, _watch, apps):
        # The schema lets weights on some targets only through; no weighted draw can be made of it.
        kube.create(rewrite("mixed", "m", ("a", 1), ("b", None)))
        kube.create(rewrite("good", "n", ("n-v2", None)))
        kube.create(objective("other-pool", 3, pool="elsewhere"))  # not this pool's: not read at all
        await every_picker(apps, lambda a: resolve(a, "n").target == "n-v2")
        assert resolve(apps[0], "m").target == "m"  # the refused rewrite does nothing
        view = await pool_view(collector)
        (refused,) = view["cluster"]["refused"]
        assert refused["name"] == "mixed"
        assert "set a weight on every target or on none" in refused["reason"]
        assert [o["name"] for o in view["cluster"]["rewrites"]] == ["good"]
        assert view["cluster"]["objectives"] == []
        kind = "InferenceModelRewrite"
        assert (
            sample(
                collector,
                "pointsman_collector_cluster_objects",
                kind=kind,
                api_version=GIE_V,
                name="mixed",
                result="refused",
            )
            == 1
        )
        status = kube.get(rewrite("mixed", None))["status"]["conditions"][0]
        assert (status["status"], status["reason"]) == ("False", "Invalid")
        assert "weight" in status["message"]


async def test_rbac_denied_and_a_crd_absent_are_counted_and_picked_up_later(
    redis: RedisServer, kube: KubeApi
) -> None:
    # llm-d's CRDs installed but not granted; GIE's granted but not installed.
    everything: set[Permission] = {
        ("default", group, f"{resource}{sub}", verb)
        for group in ("inference.networking.x-k8s.io", "llm-d.ai")
        for resource in ("inferenceobjectives", "inferencemodelrewrites")
        for sub, verb in (("", "list"), ("", "watch"), ("/status", "patch"))
    }
    kube.allowed = {p for p in everything if p[1] != "llm-d.ai"}
    kube.install(LLM_D)
    kube.create(objective("premium", 10, api_version=LLM_D_V))
    async with running(redis.url, kube) as (collector, watch, apps):
        labels = {"kind": "InferenceObjective"}

        def state(api_version: str, wanted: str) -> bool:
            value = sample(
                collector,
                "pointsman_collector_cluster_watch_state",
                **labels,
                api_version=api_version,
                state=wanted,
            )
            return value == 1.0

        async def both_failing() -> bool:
            return state(LLM_D_V, "forbidden") and state(GIE_V, "absent")

        await eventually(both_failing, within=10.0, interval=0.02)
        failures = sample(
            collector,
            "pointsman_collector_cluster_watch_failures_total",
            **labels,
            api_version=LLM_D_V,
            state="forbidden",
        )
        assert failures is not None
        assert failures >= 1
        assert resolve(apps[0], "m", "premium").priority == 0  # not visible: the default objective

        kube.allowed = everything  # the Role granted: the next retry lists it
        await every_picker(apps, lambda a: resolve(a, "m", "premium").priority == 10)
        kube.install(GIE)  # the CRD installed: its objects are picked up too
        kube.create(objective("batch", -3))
        await every_picker(apps, lambda a: resolve(a, "m", "batch").priority == -3)
        assert state(GIE_V, "watching")
        assert state(LLM_D_V, "watching")
        # An objective of the same name in both groups: the GIE group's is used, llm-d's refused.
        kube.create(objective("batch", 4, api_version=LLM_D_V))

        async def shadowed() -> bool:
            return [r.name for r in watch.objects.refused] == ["batch"]

        await eventually(shadowed, within=10.0, interval=0.02)
        assert resolve(apps[1], "m", "batch").priority == -3


async def test_pickers_keep_the_last_set_through_a_redis_outage(redis: RedisServer, kube: KubeApi) -> None:
    kube.install(GIE)
    async with running(redis.url, kube) as (_, _watch, apps):
        kube.create(objective("batch", -1))
        await every_picker(apps, lambda a: resolve(a, "m", "batch").priority == -1)
        redis.kill()
        kube.replace(objective("batch", 2))  # changed while Redis is down
        await asyncio.sleep(0.3)  # some failed reads and writes meanwhile
        assert all(resolve(a, "m", "batch").priority == -1 for a in apps)  # the last set stays
        redis.restart()  # empty: the collector writes the set again
        await every_picker(apps, lambda a: resolve(a, "m", "batch").priority == 2)


@pytest.mark.parametrize(
    ("sources", "model", "named", "expected"),
    [
        # both: the config wins on a clash, the cluster fills in the rest
        ("both", "configured", "clash", ("configured-v1", 7, "config/configured", "config/clash")),
        ("both", "m", "clash", ("m-v2", 7, "cluster/canary", "config/clash")),
        ("both", "m", "premium", ("m-v2", 10, "cluster/canary", "cluster/premium")),
        # cluster: the config's models and objectives are not used
        ("cluster", "configured", "clash", ("configured-v2", -2, "cluster/canary", "cluster/clash")),
        # config: the cluster's objects are not used
        ("config", "m", "premium", ("m", 0, "", "")),
        ("config", "configured", "clash", ("configured-v1", 7, "config/configured", "config/clash")),
    ],
)
async def test_the_switch_chooses_the_sources(
    redis: RedisServer, kube: KubeApi, sources: str, model: str, named: str, expected: tuple[Any, ...]
) -> None:
    kube.install(GIE)
    canary = rewrite("canary", "m", ("m-v2", None))
    canary["spec"]["rules"].append(
        {"matches": [{"model": {"value": "configured"}}], "targets": [{"modelRewrite": "configured-v2"}]}
    )
    kube.create(canary)
    kube.create(objective("clash", -2))
    kube.create(objective("premium", 10))
    async with running(redis.url, kube, pickers=1, sources=sources) as (_, _watch, (app,)):
        source = app.source
        assert isinstance(source, RedisSnapshotSource)

        async def applied() -> bool:  # with "config" too: the set is read, and not used
            return source.cluster is not None and len(source.cluster.objectives) == 2

        await eventually(applied, within=10.0, interval=0.02)
        got = resolve(app, model, named)
        assert (got.target, got.priority, got.rewrite, got.objective) == expected


async def test_a_canary_rewrite_splits_90_10_over_1000_requests(redis: RedisServer, kube: KubeApi) -> None:
    kube.install(GIE)
    kube.create(rewrite("canary", "m", ("m-stable", 90), ("m-canary", 10)))
    async with running(redis.url, kube, pickers=2, seed=23) as (_, _watch, apps):
        await every_picker(apps, lambda a: resolve(a, "m").rewrite == "cluster/canary")
        n = 1000
        counts = Counter(resolve(apps[i % 2], "m").target for i in range(n))
    assert set(counts) == {"m-stable", "m-canary"}
    # Binomial(1000, 0.1): mean 100, sd 9.5; seeded, so the count is fixed, and within 4 sd of the mean.
    mean, sd = n * 0.1, math.sqrt(n * 0.1 * 0.9)
    assert abs(counts["m-canary"] - mean) <= 4 * sd


def _crd_keys(crds: list[Crd]) -> set[tuple[str, str]]:
    return {(c.group_version, c.resource) for c in crds}


def test_the_crds_served_here_are_the_kinds_the_collector_watches() -> None:
    from pointsman_collector.kubernetes.cluster_objects import API_VERSIONS, RESOURCES

    assert _crd_keys(GIE) | _crd_keys(LLM_D) == {(v, r) for v in API_VERSIONS for r in RESOURCES.values()}
