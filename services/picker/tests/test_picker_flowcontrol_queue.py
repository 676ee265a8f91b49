"""The flow queue's dispatch order and bounds: bands, turns, FCFS, expiry, cancellation."""

from __future__ import annotations

import pytest

from pointsman_picker.flowcontrol.queue import Bounds, FlowQueue, Full

BIG = Bounds(100, 10_000)


def queue(
    total: Bounds = BIG, bands: dict[int, Bounds] | None = None, default: Bounds = BIG
) -> FlowQueue[str]:
    return FlowQueue(total, bands or {}, default)


def fill(q: FlowQueue[str], *items: tuple[str, int, str], ttl: float = 10.0) -> None:
    """Each ``(name, priority, flow)`` pushed in order, one second apart, 10 bytes each."""
    for at, (name, priority, flow) in enumerate(items):
        q.push(name, priority=priority, flow=flow, size=10, now=float(at), ttl=ttl)


def order(q: FlowQueue[str]) -> list[str]:
    return [entry.item for entry in q.drain()]


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        # first come first served within a flow
        ([("a1", 0, "a"), ("a2", 0, "a"), ("a3", 0, "a")], ["a1", "a2", "a3"]),
        # bands by priority, highest first, whatever the arrival
        ([("low", -1, "a"), ("mid", 0, "a"), ("high", 5, "a")], ["high", "mid", "low"]),
        # flows take turns: the loud tenant does not go first ten times
        (
            [("a1", 0, "a"), ("a2", 0, "a"), ("a3", 0, "a"), ("b1", 0, "b"), ("c1", 0, "c")],
            ["a1", "b1", "c1", "a2", "a3"],
        ),
        # turns within each band; bands still first
        (
            [("a1", 0, "a"), ("a2", 0, "a"), ("b1", 0, "b"), ("s1", -1, "a"), ("s2", -1, "b")],
            ["a1", "b1", "a2", "s1", "s2"],
        ),
    ],
)
def test_dispatch_order(items, expected):
    q = queue()
    fill(q, *items)
    assert order(q) == expected
    assert len(q) == 0
    assert q.bytes == 0


def test_a_flow_served_goes_behind_the_others_of_its_band():
    q = queue()
    fill(q, ("a1", 0, "a"), ("a2", 0, "a"), ("b1", 0, "b"))
    assert q.pop().item == "a1"
    fill(q, ("c1", 0, "c"))  # a new flow joins behind those waiting
    assert order(q) == ["b1", "a2", "c1"]


@pytest.mark.parametrize(
    ("total", "bands", "default", "scope", "what"),
    [
        (Bounds(2, 10_000), {}, BIG, "queue", "requests"),
        (Bounds(100, 25), {}, BIG, "queue", "bytes"),
        (BIG, {0: Bounds(2, 10_000)}, BIG, "band", "requests"),
        (BIG, {0: Bounds(100, 25)}, BIG, "band", "bytes"),
        (BIG, {}, Bounds(2, 10_000), "band", "requests"),  # a band no config names
    ],
)
def test_bounds(total, bands, default, scope, what):
    q = queue(total, bands, default)
    fill(q, ("a", 0, "f"), ("b", 0, "f"))
    with pytest.raises(Full) as raised:
        fill(q, ("c", 0, "g"))
    assert (raised.value.scope, raised.value.what) == (scope, what)
    assert len(q) == 2
    assert q.bytes == 20


def test_a_band_bound_leaves_other_bands_room():
    q = queue(bands={0: Bounds(1, 10_000)})
    fill(q, ("a", 0, "f"))
    with pytest.raises(Full):
        fill(q, ("b", 0, "f"))
    fill(q, ("c", 1, "f"))
    assert order(q) == ["c", "a"]


def test_expiry_takes_the_overdue_in_every_flow_and_band():
    q = queue()
    fill(q, ("a1", 0, "a"), ("b1", 0, "b"), ("s1", -1, "a"), ("a2", 0, "a"), ttl=2.5)  # at 0, 1, 2, 3
    assert q.next_deadline() == 2.5
    gone = q.expired(now=3.6)  # deadlines 2.5, 3.5, 4.5, 5.5
    assert [e.item for e in gone] == ["a1", "b1"]
    assert q.next_deadline() == 4.5
    assert order(q) == ["a2", "s1"]


def test_cancelled_entries_leave_at_once_and_are_never_dispatched():
    q = queue(total=Bounds(2, 10_000))
    fill(q, ("a1", 0, "a"), ("a2", 0, "a"))
    first = q.head()
    assert first is not None
    assert q.remove(first)
    assert not q.remove(first)  # gone already
    assert len(q) == 1
    assert q.bytes == 10
    fill(q, ("a3", 0, "a"))  # its room is free again
    assert order(q) == ["a2", "a3"]


def test_expired_and_cancelled_are_not_answered_twice():
    q = queue()
    fill(q, ("a1", 0, "a"), ("a2", 0, "a"), ttl=1.0)
    [expired] = q.expired(now=1.0)
    assert not q.remove(expired)
    assert q.expired(now=1.0) == []
    assert order(q) == ["a2"]


def test_sizes_by_band_and_flow():
    q = queue()
    fill(q, ("a1", 0, "a"), ("a2", 0, "a"), ("b1", -1, "b"))
    assert sorted(q.sizes()) == [(-1, "b", 1, 10), (0, "a", 2, 20)]


@pytest.mark.parametrize(
    ("items", "priority", "expected"),
    [
        ([], 0, False),
        ([("low", -1, "a")], 0, False),  # a critical request does not go behind sheddable ones
        ([("low", -1, "a")], -1, True),
        ([("mid", 0, "a")], -1, True),
        ([("high", 5, "a")], 0, True),
    ],
)
def test_ahead(items, priority, expected):
    q = queue()
    fill(q, *items)
    assert q.ahead(priority) is expected


@pytest.mark.parametrize(
    ("items", "limit", "expected"),
    [
        # each flow's first in turn, then each one's second: the order dispatch would take
        ([("a1", 0, "a"), ("a2", 0, "a"), ("b1", 0, "b"), ("a3", 0, "a")], 10, ["a1", "b1", "a2", "a3"]),
        ([("a1", 0, "a"), ("a2", 0, "a"), ("b1", 0, "b")], 2, ["a1", "b1"]),
        # the highest band only: a lower one waits while a higher one waits
        ([("low", -1, "a"), ("high", 0, "b"), ("high2", 0, "b")], 10, ["high", "high2"]),
        ([], 10, []),
    ],
)
def test_scan(items, limit, expected):
    q = queue()
    fill(q, *items)
    assert [e.item for e in q.scan(limit)] == expected


def test_take_from_behind_the_head_keeps_the_rest_in_order_and_the_flow_takes_its_turn():
    q = queue()
    fill(q, ("a1", 0, "a"), ("a2", 0, "a"), ("a3", 0, "a"), ("b1", 0, "b"))
    a2 = q.scan(10)[2]
    assert a2.item == "a2"
    q.take(a2)
    assert (len(q), q.bytes) == (3, 30)
    assert order(q) == ["b1", "a1", "a3"]  # flow a was served: b goes first


def test_taking_the_last_entry_empties_the_queue():
    q = queue()
    fill(q, ("a1", 0, "a"))
    q.take(q.scan(1)[0])
    assert (len(q), q.head(), q.ahead(0)) == (0, None, False)
