"""The picker's metrics: every event under today's names and upstream's (GIE v1.5.0), and the pool gauges
read from the snapshot at scrape time."""

from __future__ import annotations

import asyncio
import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from pointsman_picker.accesslog import LoggedResponse
from pointsman_picker.metrics import (
    PickerMetrics,
    PrefixIndexCollector,
    RuntimeCollector,
    SnapshotCollector,
    loop_tasks,
)
from pointsman_picker.routing import Completion, Routing, Usage
from pointsman_shared.snapshot import PoolSnapshot
from pointsman_testkit import NOW, pod, pool_pods, snapshot

LABELS = {"model_name": "m", "target_model_name": "t"}
USAGE = Usage(7, 3)

# Upstream's buckets, copied from GIE v1.5.0 pkg/epp/metrics/metrics.go (32778 is upstream's).
UPSTREAM_LATENCY = [
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60,
    120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
]  # fmt: skip
UPSTREAM_BUCKETS = {
    "inference_objective_request_duration_seconds": UPSTREAM_LATENCY,
    "inference_objective_request_sizes": [
        64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576,
        2097152, 4194304, 8388608, 16777216, 33554432, 67108864, 134217728, 268435456, 536870912, 1073741824,
    ],
    "inference_objective_response_sizes": [
        1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536,
    ],
    "inference_objective_input_tokens": [
        1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072, 262144, 524288,
        1048576,
    ],
    "inference_objective_output_tokens": [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192],
}  # fmt: skip


def done(status: int = 200, usage: Usage | None = USAGE, duration: float = 1.5) -> Completion:
    return Completion("m", "t", 0, status, duration, 100, 300, usage)


def routing(model: str = "m") -> Routing:
    return Routing("10.0.0.1:8000", b"{}", rewritten=False, model=model, target="t", priority=-1)


class Scrape:
    """What the registry shows: ``value(name, **labels)`` or None when no such sample exists."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def __call__(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self._registry.get_sample_value(name, labels or {})


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> PickerMetrics:
    return PickerMetrics(registry)


@pytest.fixture
def value(registry: CollectorRegistry) -> Scrape:
    return Scrape(registry)


# --- the request side ---------------------------------------------------------------------------------


def test_a_routed_request_is_counted_under_both_names_and_runs_until_its_stream_ends(
    metrics: PickerMetrics, value: Scrape
) -> None:
    metrics.routed("m", "t", -1, "default", "picked")
    metrics.routed("m", "t", -1, "default", "picked")  # the cached children count again
    assert value("inference_model_request_total", LABELS) == 2
    assert value("inference_objective_request_total", LABELS | {"priority": "-1"}) == 2
    assert value("pointsman_picker_decisions_total", {"profile": "default", "result": "picked"}) == 2
    assert value("inference_objective_running_requests", {"model_name": "m"}) == 2
    metrics.finished(routing())
    metrics.finished(routing())
    assert value("inference_objective_running_requests", {"model_name": "m"}) == 0


def test_the_priority_label_is_the_objectives_priority(metrics: PickerMetrics, value: Scrape) -> None:
    metrics.routed("m", "t", 0, "default", "picked")
    metrics.routed("m", "t", 10, "default", "picked")
    assert value("inference_objective_request_total", LABELS | {"priority": "0"}) == 1
    assert value("inference_objective_request_total", LABELS | {"priority": "10"}) == 1
    assert value("inference_model_request_total", LABELS) == 2  # today's name has no priority label


def test_a_request_without_a_model_is_routed_but_not_counted_as_running(
    metrics: PickerMetrics, registry: CollectorRegistry, value: Scrape
) -> None:
    metrics.routed("", "", 0, "default", "picked")
    metrics.finished(routing(model=""))
    assert value(
        "inference_objective_request_total", {"model_name": "", "target_model_name": "", "priority": "0"}
    )
    assert not _samples(registry, "inference_objective_running_requests")


def test_a_failed_request_is_counted_under_both_names(metrics: PickerMetrics, value: Scrape) -> None:
    metrics.failed("m", "t", "InferencePoolResourceExhausted", "default", "no_capacity")
    code = {"error_code": "InferencePoolResourceExhausted"}
    assert value("inference_model_request_error_total", LABELS | code) == 1
    assert value("inference_objective_request_error_total", LABELS | code) == 1
    assert value("pointsman_picker_decisions_total", {"profile": "default", "result": "no_capacity"}) == 1
    assert value("inference_objective_request_total", LABELS | {"priority": "0"}) is None


# --- the response side --------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["inference_model", "inference_objective"])
@pytest.mark.parametrize(
    ("completion", "tokens"),
    [(done(), 1.0), (done(usage=None), 0.0), (done(status=500, usage=None), 0.0)],
    ids=["usage", "no-usage", "error"],
)
def test_a_completed_response_is_observed(
    metrics: PickerMetrics, value: Scrape, prefix: str, completion: Completion, tokens: float
) -> None:
    metrics.completed(completion)
    assert value(f"{prefix}_request_duration_seconds_sum", LABELS) == 1.5
    assert value(f"{prefix}_request_sizes_sum", LABELS) == 100
    assert value(f"{prefix}_response_sizes_sum", LABELS) == 300
    assert value(f"{prefix}_input_tokens_count", LABELS) == tokens
    assert value(f"{prefix}_output_tokens_count", LABELS) == tokens
    if tokens:
        assert value(f"{prefix}_input_tokens_sum", LABELS) == 7
        assert value(f"{prefix}_output_tokens_sum", LABELS) == 3


@pytest.mark.parametrize(
    ("status", "today", "upstream"),
    [
        (200, None, None),
        (404, "ModelServer404", "ModelServerError"),
        (500, "ModelServer500", "ModelServerError"),
    ],
)
def test_an_error_status_counts_with_each_names_own_code(
    metrics: PickerMetrics, value: Scrape, status: int, today: str | None, upstream: str | None
) -> None:
    metrics.completed(done(status=status))
    metrics.completed(done(status=status))
    count = 2.0 if today else None
    assert value("inference_model_request_error_total", LABELS | {"error_code": str(today)}) == count
    assert value("inference_objective_request_error_total", LABELS | {"error_code": str(upstream)}) == count


def test_upstreams_names_leave_out_zero_tokens_and_a_duration_that_is_not_positive(
    metrics: PickerMetrics, value: Scrape
) -> None:
    metrics.completed(done(usage=Usage(0, 0), duration=0.0))
    assert value("inference_model_input_tokens_count", LABELS) == 1  # today's names observe them
    assert value("inference_model_request_duration_seconds_count", LABELS) == 1
    assert value("inference_objective_input_tokens_count", LABELS) == 0
    assert value("inference_objective_output_tokens_count", LABELS) == 0
    assert value("inference_objective_request_duration_seconds_count", LABELS) == 0
    assert value("inference_objective_request_sizes_count", LABELS) == 1


def test_a_response_whose_body_was_not_shown_has_no_size(metrics: PickerMetrics, value: Scrape) -> None:
    metrics.completed(Completion("m", "t", 0, 200, 1.5, 100, None, None))
    assert value("inference_objective_request_duration_seconds_count", LABELS) == 1
    assert value("inference_objective_request_sizes_count", LABELS) == 1
    for name in ("inference_model_response_sizes_count", "inference_objective_response_sizes_count"):
        assert value(name, LABELS) == 0


def test_the_access_log_adds_the_size_and_tokens_of_a_body_not_shown(
    metrics: PickerMetrics, value: Scrape
) -> None:
    metrics.completed(Completion("m", "t", 0, 200, 1.5, 100, None, None))
    assert metrics.logged(LoggedResponse("m", "t", 275, Usage(11, 0)))
    # Once each: the duration from the ext_proc stream, the size and tokens from the log.
    assert value("inference_objective_request_duration_seconds_count", LABELS) == 1
    for name in ("inference_model_response_sizes_sum", "inference_objective_response_sizes_sum"):
        assert value(name, LABELS) == 275
    assert value("inference_model_input_tokens_sum", LABELS) == 11
    assert value("inference_model_output_tokens_count", LABELS) == 1
    assert value("inference_objective_output_tokens_count", LABELS) == 0  # zero left out, as upstream


def test_the_access_log_adds_no_series_past_its_bound(
    metrics: PickerMetrics, value: Scrape, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pointsman_picker.metrics.MAX_LOGGED_SERIES", 1)
    assert metrics.logged(LoggedResponse("m", "t", 1, None))
    assert not metrics.logged(LoggedResponse("m", "other", 1, None))
    assert metrics.logged(LoggedResponse("m", "t", 1, None))  # a series it has goes on
    assert value("inference_model_response_sizes_count", LABELS) == 2


@pytest.mark.parametrize("name", sorted(UPSTREAM_BUCKETS))
def test_upstreams_histograms_have_upstreams_buckets(
    metrics: PickerMetrics, registry: CollectorRegistry, name: str
) -> None:
    metrics.completed(done())
    bounds = [float(s.labels["le"]) for s in _samples(registry, name) if s.name == f"{name}_bucket"]
    assert bounds == [*map(float, UPSTREAM_BUCKETS[name]), math.inf]


def test_upstreams_labels(metrics: PickerMetrics, registry: CollectorRegistry) -> None:
    metrics.routed("m", "t", 0, "default", "picked")
    metrics.failed("m", "t", "BadRequest", "default", "bad_request")
    metrics.completed(done())
    labels = {
        family.name: set(family.samples[0].labels) - {"le"}
        for family in registry.collect()
        if family.name.startswith("inference_objective_") and family.samples
    }
    model = {"model_name", "target_model_name"}
    assert labels == {
        "inference_objective_request": model | {"priority"},
        "inference_objective_request_error": model | {"error_code"},
        "inference_objective_running_requests": {"model_name"},
        **dict.fromkeys(UPSTREAM_BUCKETS, model),
    }


# --- the pool gauges ----------------------------------------------------------------------------------


class Source:
    def __init__(self, current: PoolSnapshot | None) -> None:
        self.snapshot = current

    def current(self) -> PoolSnapshot | None:
        return self.snapshot


def pool_registry(source: Source) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(source, "pool-a", lambda: NOW + 3))
    return registry


def test_the_pool_gauges_are_upstreams_over_the_healthy_pods() -> None:
    pods = pool_pods(
        pod(waiting=2, kv=0.2, running=4),
        pod(waiting=4, kv=0.4, running=6),
        pod(waiting=9, kv=1.0, running=9, healthy=False, reason="stale"),
    )
    value = Scrape(pool_registry(Source(snapshot(*pods, version=7))))
    pool = {"name": "pool-a"}
    assert value("inference_pool_ready_pods", pool) == 2
    assert value("inference_pool_average_kv_cache_utilization", pool) == pytest.approx(0.3)
    assert value("inference_pool_average_queue_size", pool) == 3
    assert value("inference_pool_average_running_requests", pool) == 5
    assert value("pointsman_picker_snapshot_version", pool) == 7
    assert value("pointsman_picker_snapshot_age_seconds", pool) == 3


def test_the_per_pod_queue_has_every_pod_by_upstreams_labels() -> None:
    pods = pool_pods(pod(waiting=2), pod(waiting=9, healthy=False, reason="stale"))
    registry = pool_registry(Source(snapshot(*pods)))
    queues = {
        (s.labels["name"], s.labels["model_server_pod"]): s.value
        for s in _samples(registry, "inference_pool_per_pod_queue_size")
    }
    assert queues == {("pool-a", "192.168.1.1:8000"): 2, ("pool-a", "192.168.1.2:8000"): 9}


def test_a_pod_that_left_leaves_no_series_and_no_snapshot_leaves_only_present() -> None:
    source = Source(snapshot(*pool_pods(pod(), pod())))
    registry = pool_registry(source)
    source.snapshot = snapshot(*pool_pods(pod()), version=2)
    assert len(_samples(registry, "inference_pool_per_pod_queue_size")) == 1
    source.snapshot = snapshot(version=3)  # no pods: no averages
    assert _samples(registry, "inference_pool_average_queue_size") == []
    assert Scrape(registry)("inference_pool_ready_pods", {"name": "pool-a"}) == 0
    source.snapshot = None
    names = {family.name for family in text_string_to_metric_families(_page(registry))}
    assert names == {"pointsman_picker_snapshot_present"}
    assert Scrape(registry)("pointsman_picker_snapshot_present", {"name": "pool-a"}) == 0


def _page(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def _samples(registry: CollectorRegistry, family: str) -> list[Sample]:
    return [sample for metric in registry.collect() if metric.name == family for sample in metric.samples]


# --- what the picker holds open -----------------------------------------------------------------------


async def test_the_runtime_gauges_count_open_streams_and_the_event_loops_tasks(
    registry: CollectorRegistry, value: Scrape
) -> None:
    streams = [3]
    registry.register(RuntimeCollector(open_streams=lambda: streams[0]))
    before = value("pointsman_picker_event_loop_tasks")
    assert before is not None
    assert before >= 1  # this test's own task
    sleepers = [asyncio.create_task(asyncio.sleep(10)) for _ in range(5)]
    try:
        assert value("pointsman_picker_event_loop_tasks") == before + 5
        assert value("pointsman_picker_open_streams") == 3
        streams[0] = 0
        assert value("pointsman_picker_open_streams") == 0
    finally:
        for task in sleepers:
            task.cancel()
        await asyncio.gather(*sleepers, return_exceptions=True)
    assert value("pointsman_picker_event_loop_tasks") == before


def test_outside_an_event_loop_there_are_no_tasks_to_count() -> None:
    assert loop_tasks() == 0


def test_the_prefix_index_collector_reads_the_index_and_the_sync_at_scrape_time():
    from pointsman_picker.prefix_sync import RedisPrefixSync
    from pointsman_picker.scheduling import CycleState, SchedulingRequest, Ticket
    from pointsman_picker.scheduling.assignments import POSITIONS
    from pointsman_picker.scheduling.prefix_cache import PrefixCacheProducer
    from pointsman_shared.keys import RedisKeys

    producer = PrefixCacheProducer(auto_tune=False)
    plugins = [producer]
    syncs: list[RedisPrefixSync | None] = [None]
    registry = CollectorRegistry()
    registry.register(PrefixIndexCollector(lambda: plugins, lambda: syncs[0]))

    def values() -> dict[str, float]:
        families = text_string_to_metric_families(generate_latest(registry).decode())
        return {s.name: s.value for f in families for s in f.samples if "prefix" in s.name}

    assert values() == {
        "inference_extension_prefix_indexer_size": 0,
        "pointsman_picker_prefix_outbox_blocks": 0,
    }
    pods = pool_pods(pod(), pod())
    request = SchedulingRequest("m", True, {"prompt": "x" * 640})
    state = CycleState()
    state[POSITIONS] = {p.address: i for i, p in enumerate(pods)}
    producer.prepare(request, pods, state, 0.0)
    producer.picked(Ticket(1, pods[0].address, 0.0), request, state)
    syncs[0] = sync = RedisPrefixSync("redis://127.0.0.1:1/0", RedisKeys("p"), lambda: plugins)  # not started
    sync.published, sync.learnt, sync.failures = 3, 5, 2
    assert values() == {
        "inference_extension_prefix_indexer_size": 10,
        "pointsman_picker_prefix_outbox_blocks": 10,
        "pointsman_picker_prefix_sync_entries_published_total": 3,
        "pointsman_picker_prefix_sync_announcements_learnt_total": 5,
        "pointsman_picker_prefix_sync_failures": 2,
    }
    plugins.clear()  # a reload to a profile without the index
    assert values()["inference_extension_prefix_indexer_size"] == 0
