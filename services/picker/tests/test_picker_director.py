"""The director: resolution, freshness, failure mode, metrics (no gRPC)."""

from __future__ import annotations

import collections
import itertools
import random
import time

import pytest
from picker_builders import NOW, config, ctx, pod, snapshot
from prometheus_client import CollectorRegistry, generate_latest

from pointsman_picker import errors
from pointsman_picker.director import PLUGIN_TIMING_EVERY, Director, UsablePods, usable_pods
from pointsman_picker.metrics import PickerMetrics
from pointsman_picker.snapshots import StaticSnapshotSource
from pointsman_shared.cluster import (
    ClusterObjective,
    ClusterObjects,
    ClusterRewrite,
    RewriteRule,
    RewriteTarget,
)
from pointsman_shared.snapshot import PoolSnapshot

BODY = b'{"model":"my-model","prompt":"hi"}'


def director(snap=None, clock=lambda: NOW, **sections) -> tuple[Director, CollectorRegistry]:
    registry = CollectorRegistry()
    source = StaticSnapshotSource(snap)
    d = Director(
        config(**sections),
        source,
        PickerMetrics(registry),
        rng=random.Random(1),
        clock=clock,
        timer=time.perf_counter,
    )
    return d, registry


def test_routes_and_counts():
    d, registry = director(snapshot(pod(address="10.0.0.1:8000")))
    routing = d.route(ctx(BODY))
    assert routing.endpoint == "10.0.0.1:8000"
    assert routing.rewritten
    assert routing.body == b'{"model":"my-model-12345","prompt":"hi"}'
    labels = {"model_name": "my-model", "target_model_name": "my-model-12345"}
    assert registry.get_sample_value("inference_model_request_total", labels) == 1
    assert (
        registry.get_sample_value(
            "pointsman_picker_decisions_total", {"profile": "default", "result": "picked"}
        )
        == 1
    )
    assert registry.get_sample_value("inference_extension_scheduler_e2e_duration_seconds_count") == 1


def test_a_model_without_targets_is_not_rewritten():
    d, _ = director(snapshot(pod()))
    raw = b'{"model": "plain"}'
    routing = d.route(ctx(raw))
    assert routing.body is raw
    assert not routing.rewritten


def test_no_body_routes_without_a_model():
    d, registry = director(snapshot(pod(address="10.0.0.7:8000")))
    routing = d.route(ctx(None))
    assert (routing.endpoint, routing.body) == ("10.0.0.7:8000", None)
    assert (
        registry.get_sample_value(
            "inference_model_request_total", {"model_name": "", "target_model_name": ""}
        )
        == 1
    )


def test_a_passed_through_model_with_a_lone_surrogate_keeps_metrics_readable():
    # Found by test_picker_body_properties: the label '\ud800' made every /metrics render raise.
    d, registry = director(snapshot(pod()), picker={"passthroughUnknownModels": True})
    routing = d.route(ctx(b'{"model":"\\ud800x"}'))
    assert routing.model == "\ufffdx"
    assert "\ufffdx" in generate_latest(registry).decode()


def test_unknown_model_is_404_naming_the_model():
    d, _ = director(snapshot(pod()))
    with pytest.raises(errors.UnknownModel, match="'nope'") as caught:
        d.route(ctx(b'{"model":"nope"}'))
    assert caught.value.model == ""  # client input never becomes a metric label


def test_sheddable_without_capacity_is_429():
    d, _ = director(snapshot(pod(waiting=50)))
    with pytest.raises(errors.NoCapacity) as caught:
        d.route(ctx(b'{"model":"sql-lora-sheddable"}'))
    assert (caught.value.model, caught.value.target) == ("sql-lora-sheddable", "sql-lora-1fdg3")


FRESH = pod(waiting=100, address="fresh", updated_at=NOW - 1)
STALE = pod(waiting=0, address="stale", updated_at=NOW - 3)
SICK = pod(waiting=0, address="sick", healthy=False)


@pytest.mark.parametrize(
    ("pods", "expected", "stale"),
    [
        ((FRESH, STALE, SICK), ["fresh"], False),
        ((STALE, SICK), ["stale", "sick"], True),
        ((), [], True),
    ],
)
def test_usable_pods(pods, expected, stale):
    usable, is_stale = usable_pods(snapshot(*pods), NOW, 2.0)
    assert [p.address for p in usable] == expected
    assert is_stale is stale


def test_stale_pods_are_used_when_nothing_fresh_exists():
    d, registry = director(snapshot(STALE))
    assert d.route(ctx(BODY)).endpoint == "stale"
    assert (
        registry.get_sample_value(
            "pointsman_picker_decisions_total", {"profile": "default", "result": "picked_stale"}
        )
        == 1
    )


@pytest.mark.parametrize("snap", [None, snapshot()])
def test_fail_close_without_pods_is_503(snap):
    d, _ = director(snap)
    with pytest.raises(errors.NoEndpoints):
        d.route(ctx(BODY))


@pytest.mark.parametrize("snap", [None, snapshot()])
def test_fail_open_without_pods_uses_a_configured_endpoint(snap):
    pool = {"name": "test-pool", "failureMode": "FailOpen", "endpoints": ["10.1.0.1", "10.1.0.2:9000"]}
    d, registry = director(snap, pool=pool)
    seen = {d.route(ctx(BODY)).endpoint for _ in range(50)}
    assert seen == {"10.1.0.1:8000", "10.1.0.2:9000"}
    assert (
        registry.get_sample_value(
            "pointsman_picker_decisions_total", {"profile": "default", "result": "fail_open"}
        )
        == 50
    )


def test_fail_open_without_endpoints_uses_the_last_known_healthy_pods():
    # A pool discovered in Kubernetes lists no endpoints: FailOpen falls back to the pods of the newest
    # snapshot it saw, once the collector has gone quiet.
    source = StaticSnapshotSource(
        snapshot(
            pod(address="10.2.0.1:8000"), pod(address="10.2.0.2:8000"), pod(address="sick", healthy=False)
        )
    )
    clock = [NOW]
    cfg = config(pool={"name": "test-pool", "failureMode": "FailOpen"})
    d = Director(
        cfg,
        source,
        PickerMetrics(CollectorRegistry()),
        rng=random.Random(1),
        clock=lambda: clock[0],
        timer=time.perf_counter,
    )
    d.route(ctx(BODY))
    source.set(None)  # the snapshot expired in Redis
    assert {d.route(ctx(BODY)).endpoint for _ in range(30)} == {"10.2.0.1:8000", "10.2.0.2:8000"}
    clock[0] += 60
    source.set(snapshot(pod(address="10.2.0.9:8000", healthy=False)))  # stale, and all pods unhealthy
    assert {d.route(ctx(BODY)).endpoint for _ in range(10)} == {"10.2.0.9:8000"}


def test_fail_open_without_endpoints_or_any_pod_seen_is_503():
    d, _ = director(None, pool={"name": "test-pool", "failureMode": "FailOpen"})
    with pytest.raises(errors.NoEndpoints):
        d.route(ctx(BODY))


def routed_to(d: Director, times: int) -> list[str]:
    return [d.route(ctx(BODY)).endpoint for _ in range(times)]


@pytest.mark.parametrize(("count", "expected"), [(True, {"idle": 5, "b": 2, "c": 2}), (False, {"idle": 9})])
def test_a_burst_between_two_snapshots_spreads(count, expected):
    # One pod looks idle, two have 3 waiting; nine requests arrive before the next snapshot.
    pods = (pod(0, address="idle"), pod(3, address="b"), pod(3, address="c"))
    ticks = itertools.count(1)
    d, _ = director(snapshot(*pods), lambda: NOW + next(ticks) / 1000, picker={"countAssignments": count})
    # Counted, the nine even out the queues (5 + 0, 2 + 3, 2 + 3); uncounted, all go to "idle".
    assert collections.Counter(routed_to(d, 9)) == expected


def test_a_snapshot_published_longer_ago_than_max_staleness_counts_as_none():
    old = PoolSnapshot(pool="test-pool", version=1, published_at=NOW - 3, pods=(pod(),))
    d, _ = director(old)
    with pytest.raises(errors.NoEndpoints, match="no fresh pool snapshot"):
        d.route(ctx(BODY))
    d, _ = director(old, pool={"failureMode": "FailOpen", "endpoints": ["10.1.1.1:8000"]})
    assert d.route(ctx(BODY)).endpoint == "10.1.1.1:8000"


def test_requests_that_ended_before_the_next_snapshot_do_not_count():
    pods = (pod(0, address="idle"), pod(3, address="b"), pod(3, address="c"))
    ticks = itertools.count(1)
    d, _ = director(snapshot(*pods), lambda: NOW + next(ticks) / 1000)
    for _ in range(9):  # one after the other: each ends before the next starts
        routing = d.route(ctx(BODY))
        assert routing.endpoint == "idle"
        d.release(routing)


def test_an_explained_decision_carries_its_path():
    pods = (pod(0, address="a"), pod(3, address="b"))
    ticks = itertools.count(1)
    d, _ = director(snapshot(*pods), lambda: NOW + next(ticks) / 1000)
    d.route(ctx(BODY))  # one in flight on "a"
    routing = d.route(ctx(BODY, explain=True))
    assert routing.explain == (
        "rewrite=config/my-model; pods=2 (+1 recent); critical request:2 > low queueing:2 > "
        "LoRA soft affinity:0 > least queuing:1 > least KV cache:1 > random-picker:1; picked a"
    )
    assert d.route(ctx(BODY)).explain == ""


def test_a_dropped_request_explains_why():
    d, _ = director(snapshot(pod(10, 0.9, address="a")))
    with pytest.raises(errors.NoCapacity) as raised:
        d.route(ctx(b'{"model":"sql-lora-sheddable"}', explain=True))
    assert raised.value.explain.startswith(
        "rewrite=config/sql-lora-sheddable; pods=1; critical request:0 > "
        "has capacity for sheddable requests:0;"
    )


@pytest.mark.parametrize(
    ("picker", "kind", "name"),
    [
        ({}, "filter", "least queuing"),
        ({}, "picker", "random-picker"),
        ({"profile": "scorer"}, "scorer", "queue-scorer"),
        ({"profile": "scorer"}, "picker", "max-score-picker"),
    ],
)
def test_one_decision_in_sixteen_times_each_plugin(picker, kind, name):
    d, registry = director(snapshot(pod()), picker=picker)
    for _ in range(PLUGIN_TIMING_EVERY):
        d.route(ctx(BODY))
    labels = {"plugin_type": kind, "plugin_name": name}
    assert registry.get_sample_value("inference_extension_plugin_duration_seconds_count", labels) == 1


def test_usable_pods_are_kept_until_a_pod_ages_or_the_snapshot_changes():
    usable = UsablePods(2.0)
    snap = snapshot(pod(address="old", updated_at=NOW - 1.5), pod(address="new", updated_at=NOW))
    assert [p.address for p in usable.get(snap, NOW).pods] == ["old", "new"]
    assert usable.get(snap, NOW).positions == {"old": 0, "new": 1}
    assert [p.address for p in usable.get(snap, NOW + 0.5).pods] == ["old", "new"]  # "old" is 2.0 s old
    assert [p.address for p in usable.get(snap, NOW + 0.6).pods] == ["new"]
    assert usable.get(snap, NOW + 0.6).positions == {"new": 0}
    renewed = snapshot(pod(address="old", updated_at=NOW + 0.6), version=2)
    assert [p.address for p in usable.get(renewed, NOW + 0.6).pods] == ["old"]


def test_the_cluster_s_objects_decide_and_are_named_in_the_explain_header_and_the_metrics():
    gie = "inference.networking.x-k8s.io/v1alpha2"
    rule = RewriteRule(("from-cluster",), (RewriteTarget("cluster-target", None),))
    objects = ClusterObjects(
        objectives=(ClusterObjective("premium", gie, 1, 10),),
        rewrites=(ClusterRewrite("canary", gie, 1, "2026-12-01T00:00:00Z", (rule,)),),
    )
    d, registry = director(snapshot(pod(address="a")), picker={"passthroughUnknownModels": True})
    d.apply_cluster(objects)
    body = b'{"model":"from-cluster","prompt":"hi"}'
    routing = d.route(ctx(body, objective="premium", explain=True))
    assert (routing.target, routing.priority) == ("cluster-target", 10)
    assert routing.explain.startswith("rewrite=cluster/canary objective=cluster/premium; pods=1;")
    labels = {"rewrite": "cluster/canary", "objective": "cluster/premium"}
    assert registry.get_sample_value("pointsman_picker_resolved_requests_total", labels) == 1
    # A request nothing decided: empty labels, no head in the explanation.
    d.route(ctx(b'{"model":"unlisted"}', explain=True))
    assert (
        registry.get_sample_value(
            "pointsman_picker_resolved_requests_total", {"rewrite": "", "objective": ""}
        )
        == 1
    )
