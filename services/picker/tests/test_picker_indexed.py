"""Indexed pods: every filter keeps exactly what it keeps from a plain tuple, with facts fresh, worked
out before, or carried over by ``with_waiting``; and the whole tree picks the same pods."""

from __future__ import annotations

import dataclasses
import random

import pytest
from picker_builders import pod

from pointsman_picker.scheduling import Pods, SchedulingRequest
from pointsman_picker.scheduling.filters import (
    has_capacity,
    least_kv_cache,
    least_queuing,
    lora_soft_affinity,
    low_queueing,
)
from pointsman_picker.scheduling.indexed import IndexedPods, _copy, with_waiting
from pointsman_picker.scheduling.plugins import random_picker
from pointsman_picker.scheduling.profiles import DEFAULT, Profile
from pointsman_picker.scheduling.tree import build_tree
from pointsman_shared.config import SchedulingConfig
from pointsman_shared.snapshot import FieldTimes, PodSnapshot

ADAPTERS = ["a", "b", "c", "d"]
FILTERS = {
    "low queueing": low_queueing(128),
    "has capacity": has_capacity(5, 0.8),
    "least queuing": least_queuing,
    "least KV cache": least_kv_cache,
    "LoRA soft affinity": lora_soft_affinity(0.5),
}
REQUESTS = [
    SchedulingRequest("a", critical=True),
    SchedulingRequest("b", critical=False),
    SchedulingRequest(None, critical=True),
]


def random_pods(rng: random.Random, n: int) -> Pods:
    """Waiting around the thresholds (5, 128), KV around 0.8, some pods without a free adapter slot."""
    return tuple(
        pod(
            rng.choice([0, 1, 3, 5, 6, 127, 128, 300]),
            rng.choice([0.0, 0.3, 0.8, 0.81, 1.0]),
            rng.randrange(0, 3),
            rng.sample(ADAPTERS, rng.randrange(0, 3)),
            address=f"10.0.0.{i}:8000",
        )
        for i in range(n)
    )


def waiting_changes(rng: random.Random, pods: Pods) -> dict[int, int]:
    """Some positions' waiting up or down (assignments counted, requests ended)."""
    if not pods:
        return {}
    return {
        i: max(0, pods[i].waiting + rng.choice([-130, -1, 1, 2, 130]))
        for i in rng.sample(range(len(pods)), rng.randrange(0, min(4, len(pods)) + 1))
    }


def warmed(pods: IndexedPods) -> IndexedPods:
    """Ask every fact once, as the decisions before a change would."""
    for fn in FILTERS.values():
        for request in REQUESTS:
            fn(request, pods, random.Random(0))
    return pods


def same_by_every_filter(indexed: Pods, plain: Pods, seed: int) -> None:
    assert indexed == plain
    for name, fn in FILTERS.items():
        for request in REQUESTS:
            got = fn(request, indexed, random.Random(seed))
            assert got == fn(request, plain, random.Random(seed)), (name, request)
            # What a filter keeps is plain (facts would not fit it), unless it keeps every pod.
            assert type(got) is tuple or got is indexed


@pytest.mark.parametrize("seed", range(40))
def test_filters_keep_the_same_pods_from_indexed_pods(seed):
    rng = random.Random(seed)
    plain = random_pods(rng, rng.randrange(0, 40))
    same_by_every_filter(IndexedPods(plain), plain, seed)  # facts worked out on the way
    same_by_every_filter(warmed(IndexedPods(plain)), plain, seed)  # facts worked out before


@pytest.mark.parametrize("seed", range(40))
def test_facts_carried_over_by_with_waiting_match_fresh_ones(seed):
    rng = random.Random(seed)
    indexed: Pods = warmed(IndexedPods(random_pods(rng, rng.randrange(0, 40))))
    for _ in range(10):
        changes = waiting_changes(rng, indexed)
        plain = tuple(with_waiting(tuple(indexed), changes))
        indexed = with_waiting(indexed, changes)
        assert [p.waiting for p in indexed] == [p.waiting for p in plain]
        same_by_every_filter(indexed, plain, seed)


@pytest.mark.parametrize("seed", range(20))
def test_the_tree_picks_the_same_pods_from_indexed_pods(seed):
    rng = random.Random(seed)
    plain = random_pods(rng, rng.randrange(1, 40))
    indexed = IndexedPods(plain)
    profile = Profile(DEFAULT, (build_tree(SchedulingConfig()),), (), random_picker)
    for request in REQUESTS:
        a, b = random.Random(seed), random.Random(seed)
        for _ in range(20):  # the same draws in the same order
            assert profile.schedule(request, indexed, a) == profile.schedule(request, plain, b)


def test_with_waiting_without_changes_is_the_same_pods():
    pods = IndexedPods((pod(1), pod(2)))
    assert with_waiting(pods, {}) is pods


def test_a_copy_keeps_every_field_but_waiting():
    values = {
        "address": "10.0.0.9:8000",
        "waiting": 3,
        "running": 4,
        "kv_cache_usage": 0.5,
        "max_lora": 2,
        "running_adapters": frozenset({"a"}),
        "waiting_adapters": frozenset({"b"}),
        "updated_at": 12.0,
        "healthy": False,
        "reason": "down",
        "field_times": FieldTimes(1.0, 2.0, 3.0, 4.0),
    }
    # A field added to PodSnapshot must be added here and to the copy.
    assert [f.name for f in dataclasses.fields(PodSnapshot) if f.init] == list(values)
    original = PodSnapshot(**values)
    assert _copy(original, 9) == dataclasses.replace(original, waiting=9)
