"""Indexed pods: every filter and scorer gets exactly what it gets from a plain tuple, with facts fresh,
worked out before, or carried over by ``with_waiting``; and every profile picks the same pods with the
same draws. (Each question of the view, on arbitrary pods: test_picker_indexed_properties.py.)"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml
from picker_builders import pod, state

from pointsman_picker.scheduling import Pods, SchedulingRequest
from pointsman_picker.scheduling.filters import (
    HasCapacity,
    LeastKvCache,
    LeastQueuing,
    LeastWork,
    LeastWorkWithPrefix,
    LoraSoftAffinity,
    LoraSpreadAffinity,
    LowQueueing,
    PrefixCacheAffinity,
)
from pointsman_picker.scheduling.indexed import IndexedPods, with_waiting
from pointsman_picker.scheduling.prefix_cache import PrefixMatch
from pointsman_picker.scheduling.profiles import build_profile, builtin_profiles
from pointsman_picker.scheduling.scorers import KvCacheScorer, QueueScorer
from pointsman_shared.config import parse_config

ADAPTERS = ["a", "b", "c", "d"]
FILTERS = {
    "low queueing": LowQueueing(128),
    "has capacity": HasCapacity(5, 0.8),
    "least queuing": LeastQueuing(),
    "least KV cache": LeastKvCache(),
    "LoRA soft affinity": LoraSoftAffinity(0.5),
    "LoRA spread affinity": LoraSpreadAffinity(0.5, 0.1, 2.0, 0.75),
    "least work": LeastWork(0.0345, 0.04, 20.0, 7.0, 3.5),
    "least work with prefix": LeastWorkWithPrefix(0.0345, 0.04, 20.0, 7.0, 3.5),
    "prefix affinity": PrefixCacheAffinity(0.5, 0.0),
}
SCORERS = {"queue": QueueScorer(), "KV cache": KvCacheScorer()}
REQUESTS = [
    (SchedulingRequest("a", critical=True), state()),
    (SchedulingRequest("b", critical=False), state(recent_targets=3)),
    (SchedulingRequest("a", critical=True), state(recent_targets=100)),
    (SchedulingRequest(None, critical=True), state()),
    (SchedulingRequest("c", critical=True), state(pending={"10.0.0.1:8000": 900.0, "10.0.0.3:8000": 40.0})),
    (
        # a long prompt that two pods hold most of (one of them behind a backlog)
        SchedulingRequest(None, critical=True),
        state(
            pending={"10.0.0.1:8000": 900.0},
            prompt_tokens=2_000,
            prefix=PrefixMatch(tuple(range(100)), {"10.0.0.1:8000": 90, "10.0.0.2:8000": 60}, ()),
        ),
    ),
]


def random_pods(rng: random.Random, n: int) -> Pods:
    """Waiting around the thresholds (5, 128), KV around 0.8, some pods without a free adapter slot, a
    few with an adapter waiting for one; adapter "a" is hot (its pods busy, so it spreads at times)."""
    pods = []
    for i in range(n):
        adapters = rng.sample(ADAPTERS, rng.randrange(0, 3))
        hot = "a" in adapters and rng.random() < 0.8
        pods.append(
            pod(
                rng.choice([0, 1, 3, 5, 6, 127, 128, 300]),
                rng.choice([0.0, 0.3, 0.8, 0.81, 1.0]),
                rng.randrange(0, 3),
                adapters,
                address=f"10.0.0.{i}:8000",
                running=rng.choice([0, 2, 40]) + (400 if hot else 0),
                waiting_adapters=rng.sample(ADAPTERS, rng.random() < 0.02),
            )
        )
    return tuple(pods)


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
        for request, cycle in REQUESTS:
            fn(request, pods, cycle, random.Random(0))
    return pods


def same_by_every_plugin(indexed: Pods, plain: Pods, seed: int) -> None:
    assert indexed == plain
    for name, fn in FILTERS.items():
        for request, cycle in REQUESTS:
            a, b = random.Random(seed), random.Random(seed)
            got = fn(request, indexed, cycle, a)
            assert got == fn(request, plain, cycle, b), (name, request)
            assert a.random() == b.random(), (name, request)  # the same draws
            # What a filter keeps is plain (facts would not fit it), unless it keeps every pod.
            assert type(got) is tuple or got is indexed
    for name, scorer in SCORERS.items():
        request, cycle = REQUESTS[0]
        assert scorer(request, indexed, cycle) == scorer(request, plain, cycle), name


@pytest.mark.parametrize("seed", range(40))
def test_filters_keep_the_same_pods_from_indexed_pods(seed):
    rng = random.Random(seed)
    plain = random_pods(rng, rng.randrange(0, 40))
    same_by_every_plugin(IndexedPods(plain), plain, seed)  # facts worked out on the way
    same_by_every_plugin(warmed(IndexedPods(plain)), plain, seed)  # facts worked out before


@pytest.mark.parametrize("seed", range(40))
def test_facts_carried_over_by_with_waiting_match_fresh_ones(seed):
    rng = random.Random(seed)
    indexed: Pods = warmed(IndexedPods(random_pods(rng, rng.randrange(0, 40))))
    for _ in range(10):
        changes = waiting_changes(rng, indexed)
        plain = tuple(with_waiting(tuple(indexed), changes))
        indexed = with_waiting(indexed, changes)
        assert [p.waiting for p in indexed] == [p.waiting for p in plain]
        same_by_every_plugin(indexed, plain, seed)


SHIPPED = Path(__file__).resolve().parents[3] / "config" / "profiles"
PROFILES = {
    **builtin_profiles(parse_config({})),  # the #423 tree and the scorers
    "best": build_profile(parse_config(yaml.safe_load((SHIPPED / "best.yaml").read_text(encoding="utf-8")))),
}


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("seed", range(20))
def test_every_profile_picks_the_same_pods_from_indexed_pods(seed, name):
    rng = random.Random(seed)
    plain = random_pods(rng, rng.randrange(1, 40))
    indexed = IndexedPods(plain)
    profile = PROFILES[name]
    for request, cycle in REQUESTS:
        a, b = random.Random(seed), random.Random(seed)
        for _ in range(20):  # the same draws in the same order
            assert profile.schedule(request, indexed, cycle, a) == profile.schedule(request, plain, cycle, b)


def test_with_waiting_without_changes_is_the_same_pods():
    pods = IndexedPods((pod(1), pod(2)))
    assert with_waiting(pods, {}) is pods
