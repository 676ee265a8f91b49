"""Recent assignments count as waiting requests until a scrape has seen them."""

from __future__ import annotations

import random

import pytest
from picker_builders import NOW, pod

from pointsman_picker.scheduling import CycleState, Pods, SchedulingRequest, Ticket
from pointsman_picker.scheduling.assignments import POSITIONS, RecentAssignments

ONE = (pod(address="a"),)
HORIZON = 2.0


class Recent(RecentAssignments):
    """Recent assignments recorded by address and time, each under a key of its own (as tickets are)."""

    def __init__(self) -> None:
        super().__init__(HORIZON)
        self._keys: dict[tuple[str, float], list[int]] = {}
        self._next = 0

    def add(self, address: str, at: float) -> None:
        self._next += 1
        self._keys.setdefault((address, at), []).append(self._next)
        self.record(Ticket(self._next, address, at))

    def end(self, address: str, at: float) -> None:
        keys = self._keys.get((address, at))
        self.finished(Ticket(keys.pop() if keys else -1, address, at))


def index(pods: Pods) -> dict[str, int]:
    return {p.address: i for i, p in enumerate(pods)}


def test_unseen_assignments_add_to_waiting():
    recent = Recent()
    recent.add("a", NOW + 0.01)
    recent.add("a", NOW + 0.02)
    recent.add("b", NOW - 1)  # before the last scrape of b: already in its numbers
    pods = (pod(1, address="a"), pod(0, address="b"), pod(4, address="c"))
    assert [p.waiting for p in recent.adjust(pods, index(pods), not_before=0)] == [3, 0, 4]
    assert recent.pending() == {"a": 2}


def test_a_later_scrape_drops_what_it_has_seen():
    recent = Recent()
    recent.add("a", NOW + 0.01)
    recent.add("a", NOW + 0.03)
    later = (pod(5, address="a", updated_at=NOW + 0.02),)
    assert [p.waiting for p in recent.adjust(later, index(later), not_before=0)] == [6]
    assert recent.pending() == {"a": 1}


def test_an_assignment_at_the_scrape_instant_is_not_in_it():
    """In virtual time a held request is dispatched at the very instant of the snapshot round: the
    scrape was taken before it, so it still counts."""
    recent = Recent()
    recent.add("a", NOW)
    assert [p.waiting for p in recent.adjust(ONE, index(ONE), not_before=0)] == [1]


def test_pods_gone_from_the_pool_are_forgotten():
    recent = Recent()
    recent.add("gone", NOW + 1)
    pods = (pod(address="a"),)
    assert recent.adjust(pods, index(pods), not_before=0) == pods
    assert recent.pending() == {}


def test_nothing_recorded_returns_the_same_pods():
    pods = (pod(address="a"),)
    assert Recent().adjust(pods, index(pods), not_before=0) is pods


def test_assignments_older_than_the_horizon_are_dropped():
    recent = Recent()
    recent.add("a", NOW + 1)
    recent.add("a", NOW + 5)
    assert [p.waiting for p in recent.adjust(ONE, index(ONE), not_before=NOW + 2)] == [1]


def test_an_ended_request_no_longer_counts():
    recent = Recent()
    recent.add("a", NOW + 1)
    recent.add("a", NOW + 2)
    recent.end("a", NOW + 1)
    recent.end("a", NOW + 9)  # never recorded (or already seen by a scrape): nothing to do
    recent.end("b", NOW + 1)
    assert [p.waiting for p in recent.adjust(ONE, index(ONE), not_before=0)] == [1]


@pytest.mark.parametrize("seed", range(30))
def test_adjusting_from_the_last_result_matches_counting_afresh(seed):
    """Between snapshots adjust starts from its last result; it must count what a fresh count would:
    the assignments not yet released, newer than the horizon and than their pod's scrape."""
    rng = random.Random(seed)
    recent, live = Recent(), []
    scraped, horizon, now = NOW, 0.0, NOW
    pods = (pod(1, address="a"), pod(0, address="b"), pod(4, address="c"))
    for _ in range(80):
        now += rng.choice([0.5, 1])
        op = rng.random()
        if op < 0.5:
            address = rng.choice("abcd")  # d is in no snapshot
            recent.add(address, now)
            live.append((address, now))
        elif op < 0.7 and live:
            address, at = live.pop(rng.randrange(len(live)))
            recent.end(address, at)
        elif op < 0.8:  # a new snapshot, each pod scraped at some time since the last one
            pods = tuple(
                pod(p.waiting, address=p.address, updated_at=rng.uniform(scraped, now)) for p in pods
            )
            scraped = now
        elif op < 0.9:
            horizon = max(horizon, now - rng.choice([1, 3]))
        adjusted = recent.adjust(pods, index(pods), not_before=horizon)
        seen = {p.address: max(p.updated_at, horizon) for p in pods}
        live = [(a, at) for a, at in live if a in seen and at >= seen[a]]
        assert [p.waiting for p in adjusted] == [
            p.waiting + sum(1 for a, _ in live if a == p.address) for p in pods
        ]


def test_as_a_request_plugin_it_prepares_the_pods_and_follows_each_ticket():
    recent = RecentAssignments(HORIZON)
    pods = (pod(1, address="a"), pod(0, address="b"))
    request = SchedulingRequest("m", critical=True)
    state = CycleState({POSITIONS: index(pods)})
    recent.picked(Ticket(1, "b", NOW + 0.01), request, state)
    recent.picked(Ticket(2, "b", NOW + 0.01), request, state)  # the same time: its own ticket
    assert [p.waiting for p in recent.prepare(request, pods, state, NOW + 0.02)] == [1, 2]
    assert recent.note(state) == "+2 recent"
    recent.finished(Ticket(1, "b", NOW + 0.01))
    recent.finished(Ticket(7, "b", NOW + 0.01))  # never picked: nothing to do
    assert [p.waiting for p in recent.prepare(request, pods, state, NOW + 0.02)] == [1, 1]
    # Older than the horizon: forgotten.
    assert [p.waiting for p in recent.prepare(request, pods, state, NOW + 0.01 + HORIZON + 1)] == [1, 0]
    assert recent.note(state) == ""


def test_the_horizon_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        RecentAssignments(0)
