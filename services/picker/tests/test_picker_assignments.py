"""Recent assignments count as waiting requests until a scrape has seen them."""

from __future__ import annotations

import random

import pytest
from picker_builders import NOW, pod

from pointsman_picker.assignments import RecentAssignments
from pointsman_picker.scheduling import Pods

ONE = (pod(address="a"),)


def index(pods: Pods) -> dict[str, int]:
    return {p.address: i for i, p in enumerate(pods)}


def test_unseen_assignments_add_to_waiting():
    recent = RecentAssignments()
    recent.record("a", NOW + 0.01)
    recent.record("a", NOW + 0.02)
    recent.record("b", NOW - 1)  # before the last scrape of b: already in its numbers
    pods = (pod(1, address="a"), pod(0, address="b"), pod(4, address="c"))
    assert [p.waiting for p in recent.adjust(pods, index(pods), not_before=0)] == [3, 0, 4]
    assert recent.pending() == {"a": 2}


def test_a_later_scrape_drops_what_it_has_seen():
    recent = RecentAssignments()
    recent.record("a", NOW + 0.01)
    recent.record("a", NOW + 0.03)
    later = (pod(5, address="a", updated_at=NOW + 0.02),)
    assert [p.waiting for p in recent.adjust(later, index(later), not_before=0)] == [6]
    assert recent.pending() == {"a": 1}


def test_pods_gone_from_the_pool_are_forgotten():
    recent = RecentAssignments()
    recent.record("gone", NOW + 1)
    pods = (pod(address="a"),)
    assert recent.adjust(pods, index(pods), not_before=0) == pods
    assert recent.pending() == {}


def test_nothing_recorded_returns_the_same_pods():
    pods = (pod(address="a"),)
    assert RecentAssignments().adjust(pods, index(pods), not_before=0) is pods


def test_assignments_older_than_the_horizon_are_dropped():
    recent = RecentAssignments()
    recent.record("a", NOW + 1)
    recent.record("a", NOW + 5)
    assert [p.waiting for p in recent.adjust(ONE, index(ONE), not_before=NOW + 2)] == [1]


def test_an_ended_request_no_longer_counts():
    recent = RecentAssignments()
    recent.record("a", NOW + 1)
    recent.record("a", NOW + 2)
    recent.release("a", NOW + 1)
    recent.release("a", NOW + 9)  # never recorded (or already seen by a scrape): nothing to do
    recent.release("b", NOW + 1)
    assert [p.waiting for p in recent.adjust(ONE, index(ONE), not_before=0)] == [1]


@pytest.mark.parametrize("seed", range(30))
def test_adjusting_from_the_last_result_matches_counting_afresh(seed):
    """Between snapshots adjust starts from its last result; it must count what a fresh count would:
    the assignments not yet released, newer than the horizon and than their pod's scrape."""
    rng = random.Random(seed)
    recent, live = RecentAssignments(), []
    scraped, horizon, now = NOW, 0.0, NOW
    pods = (pod(1, address="a"), pod(0, address="b"), pod(4, address="c"))
    for _ in range(80):
        now += rng.choice([0.5, 1])
        op = rng.random()
        if op < 0.5:
            address = rng.choice("abcd")  # d is in no snapshot
            recent.record(address, now)
            live.append((address, now))
        elif op < 0.7 and live:
            address, at = live.pop(rng.randrange(len(live)))
            recent.release(address, at)
        elif op < 0.8:  # a new snapshot, each pod scraped at some time since the last one
            pods = tuple(
                pod(p.waiting, address=p.address, updated_at=rng.uniform(scraped, now)) for p in pods
            )
            scraped = now
        elif op < 0.9:
            horizon = max(horizon, now - rng.choice([1, 3]))
        adjusted = recent.adjust(pods, index(pods), not_before=horizon)
        seen = {p.address: max(p.updated_at, horizon) for p in pods}
        live = [(a, at) for a, at in live if a in seen and at > seen[a]]
        assert [p.waiting for p in adjusted] == [
            p.waiting + sum(1 for a, _ in live if a == p.address) for p in pods
        ]
