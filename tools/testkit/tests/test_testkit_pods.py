"""The pod builders make the snapshots they say."""

from __future__ import annotations

from pointsman_shared.snapshot import FieldTimes, PodSnapshot
from pointsman_testkit import NOW, every_field_set, pod, pool_pods, snapshot


def test_pod_names_fields_as_upstream_tests_do() -> None:
    built = pod(3, 0.5, 4, ["a"], running=2, waiting_adapters=["b"], address="10.0.0.9:8000")
    assert built == PodSnapshot(
        address="10.0.0.9:8000",
        waiting=3,
        running=2,
        kv_cache_usage=0.5,
        max_lora=4,
        running_adapters=frozenset({"a"}),
        waiting_adapters=frozenset({"b"}),
        updated_at=NOW,
    )
    assert built.active_adapters == {"a", "b"}


def test_pod_passes_health_reason_and_field_times() -> None:
    times = FieldTimes(waiting=1.0)
    built = pod(healthy=False, reason="timeout", field_times=times, updated_at=5.0)
    assert (built.healthy, built.reason, built.field_times, built.updated_at) == (
        False,
        "timeout",
        times,
        5.0,
    )


def test_pool_pods_numbers_addresses_and_keeps_the_rest() -> None:
    first, second = pool_pods(pod(1), pod(2, adapters=["x"]))
    assert (first.address, second.address) == ("192.168.1.1:8000", "192.168.1.2:8000")
    assert (first.waiting, second.waiting, second.running_adapters) == (1, 2, frozenset({"x"}))


def test_snapshot_wraps_pods() -> None:
    built = snapshot(pod(), version=4, pool="p", published_at=2.0)
    assert (built.pool, built.version, built.published_at, len(built.pods)) == ("p", 4, 2.0, 1)


def test_every_field_set_sets_every_init_field_away_from_its_default() -> None:
    import dataclasses

    built = every_field_set()
    default = PodSnapshot(address="")
    for field in dataclasses.fields(PodSnapshot):
        if field.init:
            assert getattr(built, field.name) != getattr(default, field.name), field.name
    assert every_field_set(FieldTimes) != FieldTimes()
