"""metrics.py: the collector's own series, and the per-pod and pool gauges."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from pointsman_collector.errors import PUBLISH_REASONS, SCRAPE_REASONS
from pointsman_collector.metrics import CollectorMetrics, ShareCollector
from pointsman_collector.sharing import Share, owner
from pointsman_shared.snapshot import PodSnapshot, PoolSnapshot
from pointsman_testkit import pod


def pool(*pods: PodSnapshot) -> PoolSnapshot:
    return PoolSnapshot(pool="p", version=3, published_at=1.0, pods=pods)


class Source:
    def __init__(self) -> None:
        self.snapshot: PoolSnapshot | None = None

    def __call__(self) -> PoolSnapshot | None:
        return self.snapshot


@pytest.fixture
def setup() -> tuple[CollectorRegistry, CollectorMetrics, Source]:
    registry = CollectorRegistry()
    source = Source()
    return registry, CollectorMetrics(registry, pool="p", snapshot=source, clock=lambda: 3.5), source


def value(registry: CollectorRegistry, metric: str, **labels: str) -> float | None:
    return registry.get_sample_value(metric, labels)


def test_error_counters_start_at_zero_for_every_reason(setup) -> None:
    registry, _, _ = setup
    for reason in SCRAPE_REASONS:
        assert value(registry, "pointsman_collector_scrape_errors_total", reason=reason) == 0
    for reason in PUBLISH_REASONS:
        assert value(registry, "pointsman_collector_publish_errors_total", reason=reason) == 0


def test_per_pod_and_pool_gauges_follow_the_snapshot(setup) -> None:
    registry, _, source = setup
    assert value(registry, "inference_pool_ready_pods", name="p") == 0
    assert value(registry, "inference_pool_average_kv_cache_utilization", name="p") is None
    assert value(registry, "pointsman_collector_snapshot_age_seconds", pool="p") is None
    source.snapshot = pool(
        pod(
            address="a:1",
            waiting=4,
            running=2,
            kv=0.5,
            adapters=frozenset({"x", "y"}),
            prefix_cache_hit_rate=0.75,
        ),
        pod(address="b:1", waiting=2, kv=0.25, waiting_adapters=frozenset({"x"})),
        pod(address="c:1", waiting=100, kv=1.0, healthy=False, reason="timeout"),
    )
    a = {"pool": "p", "pod": "a:1"}
    assert value(registry, "pointsman_pod_waiting_requests", **a) == 4
    assert value(registry, "pointsman_pod_running_requests", **a) == 2
    assert value(registry, "pointsman_pod_kv_cache_usage", **a) == 0.5
    assert value(registry, "pointsman_pod_active_adapters", **a) == 2
    assert value(registry, "pointsman_pod_healthy", **a) == 1
    assert value(registry, "pointsman_pod_healthy", pool="p", pod="c:1") == 0
    # Only a pod that exports prefix-cache metrics has a hit rate.
    assert value(registry, "pointsman_pod_prefix_cache_hit_rate", **a) == 0.75
    assert value(registry, "pointsman_pod_prefix_cache_hit_rate", pool="p", pod="b:1") is None
    # Averages over the ready pods only: the unhealthy pod's numbers are not current.
    assert value(registry, "inference_pool_ready_pods", name="p") == 2
    assert value(registry, "inference_pool_average_kv_cache_utilization", name="p") == pytest.approx(0.375)
    assert value(registry, "inference_pool_average_queue_size", name="p") == 3
    assert value(registry, "pointsman_collector_pods", pool="p", health="healthy", reason="") == 2
    assert value(registry, "pointsman_collector_pods", pool="p", health="unhealthy", reason="timeout") == 1
    assert value(registry, "pointsman_collector_snapshot_age_seconds", pool="p") == 2.5  # published at 1.0


def test_a_pod_that_left_leaves_no_series(setup) -> None:
    registry, _, source = setup
    source.snapshot = pool(pod(address="a:1"), pod(address="b:1"))
    assert b'pod="b:1"' in generate_latest(registry)
    source.snapshot = pool(pod(address="a:1"))
    page = generate_latest(registry)
    assert b'pod="b:1"' not in page
    source.snapshot = pool(pod(address="a:1", healthy=False, reason="timeout"))
    assert b'health="healthy"' not in generate_latest(registry)  # no state left at a stale count
    assert b'pod="a:1"' in page


def test_collector_series_are_exposed(setup) -> None:
    registry, metrics, _ = setup
    metrics.scrape_duration.observe(0.002)
    metrics.scrape_errors.labels("timeout").inc()
    metrics.publish_duration.observe(0.0003)
    metrics.snapshot_version.set(42)
    assert value(registry, "pointsman_collector_scrape_duration_seconds_count") == 1
    assert value(registry, "pointsman_collector_scrape_errors_total", reason="timeout") == 1
    assert value(registry, "pointsman_collector_publish_duration_seconds_count") == 1
    assert value(registry, "pointsman_collector_snapshot_version") == 42


PODS = tuple(f"10.0.0.{i}:1" for i in range(40))


@pytest.mark.parametrize(
    ("members", "owned", "replicas"),
    [
        (["me"], len(PODS), 1),  # alone (or sharing off): every pod
        (["me", "other"], sum(owner(p, ["me", "other"]) == "me" for p in PODS), 2),
        (["other", "third"], sum(owner(p, ["me", "other", "third"]) == "me" for p in PODS), 3),
    ],
)
def test_share_gauges_read_the_replica_s_current_share(members: list[str], owned: int, replicas: int) -> None:
    registry = CollectorRegistry()
    share = Share("me", lambda _owned: None)
    registry.register(
        ShareCollector("p", owned=lambda: len(share.owned), replicas=lambda: len(share.members))
    )
    share.set_endpoints(PODS)
    share.set_members(members)  # a replica always counts itself
    assert 0 < owned <= len(PODS)
    assert value(registry, "pointsman_collector_owned_pods", pool="p") == owned
    assert value(registry, "pointsman_collector_live_replicas", pool="p") == replicas


async def test_the_event_loops_tasks_are_counted_at_scrape_time(setup) -> None:
    registry, _, _ = setup
    before = value(registry, "pointsman_collector_event_loop_tasks")
    assert before is not None
    assert before >= 1  # this test's own task
    sleepers = [asyncio.create_task(asyncio.sleep(10)) for _ in range(4)]
    assert value(registry, "pointsman_collector_event_loop_tasks") == before + 4
    for task in sleepers:
        task.cancel()
    await asyncio.gather(*sleepers, return_exceptions=True)
    assert value(registry, "pointsman_collector_event_loop_tasks") == before


def test_outside_an_event_loop_no_tasks_are_counted(setup) -> None:
    registry, _, _ = setup
    assert value(registry, "pointsman_collector_event_loop_tasks") == 0
