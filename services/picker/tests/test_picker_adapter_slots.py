"""What the snapshots do not show of the pods' adapter slots: the adapters this picker sent since each
pod's scrape, and where an idle adapter probably still sits in a slot."""

from __future__ import annotations

from typing import Any

import pytest
from picker_builders import pod

from pointsman_picker.scheduling import CycleState, SchedulingRequest, adapter_slots
from pointsman_picker.scheduling.adapter_slots import RESIDENT, UNSEEN_ADAPTERS, AdapterSlots
from pointsman_picker.scheduling.assignments import POSITIONS
from pointsman_picker.scheduling.contracts import Ticket

SCRAPE = 10.0  # every pod's updated_at


def pods(*specs: tuple[str, set[str]], max_lora: int = 2) -> tuple[Any, ...]:
    """Pods by (address, running adapters), all scraped at ``SCRAPE``."""
    return tuple(
        pod(max_lora=max_lora, adapters=a, address=address, updated_at=SCRAPE) for address, a in specs
    )


def prepare(slots: AdapterSlots, target: str | None, at: float, pool: tuple[Any, ...]) -> CycleState:
    state = CycleState()
    state[POSITIONS] = {p.address: i for i, p in enumerate(pool)}
    slots.prepare(SchedulingRequest(target, critical=True), pool, state, at)
    return state


def pick(slots: AdapterSlots, target: str, address: str, at: float, key: int = 0) -> None:
    slots.picked(Ticket(key, address, at), SchedulingRequest(target, critical=True), CycleState())


@pytest.mark.parametrize(
    ("name", "picks", "expected"),
    [
        ("nothing sent: nothing written", [], None),
        ("sent after the scrape: unseen", [("x", "a", 10.01)], {"a": {"x"}}),
        ("sent before the scrape: in it", [("x", "a", 9.99)], None),
        ("sent at the scrape's instant: not in it", [("x", "a", SCRAPE)], {"a": {"x"}}),
        ("already active there: shown", [("y", "b", 10.01)], None),
        (
            "several, per pod",
            [("x", "a", 10.01), ("z", "a", 10.02), ("x", "b", 10.03)],
            {"a": {"x", "z"}, "b": {"x"}},
        ),
        ("older than the horizon: taken as scraped", [("x", "a", 10.01)], None),
    ],
)
def test_the_adapters_sent_since_each_pods_scrape(name, picks, expected):
    slots = AdapterSlots(horizon=2.0)
    pool = pods(("a", set()), ("b", {"y"}))
    for target, address, at in picks:
        pick(slots, target, address, at)
    now = 12.5 if name.startswith("older") else 10.04
    state = prepare(slots, "q", now, pool)
    got = state.get(UNSEEN_ADAPTERS)
    assert (None if got is None else {a: set(s) for a, s in got.items()}) == expected, name


def test_a_target_a_scrape_soon_after_its_pick_does_not_show_is_the_base_model():
    slots = AdapterSlots()
    sent = pods(("a", set()), ("b", set()))
    pick(slots, "base", "a", 9.95)  # the scrape at 10.0 would show it, were it an adapter
    assert UNSEEN_ADAPTERS not in prepare(slots, "base", 10.01, sent)
    pick(slots, "base", "b", 10.02)  # known now: takes no slot, so never unseen
    assert UNSEEN_ADAPTERS not in prepare(slots, "base", 10.03, sent)
    # Shown active later after all: an adapter.
    shown = pods(("a", {"base"}), ("b", set()))
    prepare(slots, "base", 10.04, shown)
    pick(slots, "base", "b", 10.05)
    assert prepare(slots, "other", 10.06, shown)[UNSEEN_ADAPTERS] == {"b": frozenset({"base"})}


@pytest.mark.parametrize(
    ("name", "sent", "active", "expected"),
    [
        ("never sent there: nowhere", [("y", "a")], set(), None),
        ("sent there, one other since, 2 slots: still there", [("x", "a"), ("y", "a")], set(), {"a"}),
        ("two others since: evicted", [("x", "a"), ("y", "a"), ("z", "a")], set(), None),
        ("one other since and one active: evicted", [("x", "a"), ("y", "a")], {"w"}, None),
        (
            "sent again later: the newest counts",
            [("x", "a"), ("y", "a"), ("z", "a"), ("x", "a")],
            set(),
            {"a"},
        ),
        ("several pods", [("x", "a"), ("x", "b"), ("y", "b"), ("z", "b")], set(), {"a"}),
    ],
)
def test_where_an_idle_adapter_probably_still_sits_in_a_slot(name, sent, active, expected):
    slots = AdapterSlots()
    # "x" is known as an adapter once a scrape showed it active somewhere (pod c).
    prepare(slots, "x", 9.0, pods(("a", set()), ("b", set()), ("c", {"x"})))
    for key, (target, address) in enumerate(sent):
        pick(slots, target, address, 5.0 + key, key)  # all scraped by SCRAPE
    state = prepare(slots, "x", 10.01, pods(("a", active), ("b", set()), ("c", set())))
    assert (set(state[RESIDENT]) if RESIDENT in state else None) == expected, name


def test_an_adapter_active_somewhere_gets_no_resident_pods():
    slots = AdapterSlots()
    pool = pods(("a", set()), ("c", {"x"}))
    prepare(slots, "x", 9.0, pool)
    pick(slots, "x", "a", 5.0)
    assert RESIDENT not in prepare(slots, "x", 10.01, pool)  # the filter takes its active pods


def test_an_adapter_no_scrape_has_shown_is_resident_nowhere():
    slots = AdapterSlots()
    pick(slots, "x", "a", 5.0)
    assert RESIDENT not in prepare(slots, "x", 10.01, pods(("a", set())))


def test_the_order_is_remembered_to_its_depth():
    slots = AdapterSlots(depth=2)
    prepare(slots, "x", 9.0, pods(("a", set()), ("c", {"x"}), max_lora=4))
    for key, target in enumerate(["x", "y", "z"]):
        pick(slots, target, "a", 5.0 + key, key)
    # Forgotten past the depth: not counted.
    assert RESIDENT not in prepare(slots, "x", 10.01, pods(("a", set()), ("c", set()), max_lora=4))
    with pytest.raises(ValueError, match="depth"):
        AdapterSlots(depth=0)
    with pytest.raises(ValueError, match="horizon"):
        AdapterSlots(horizon=0)


def test_between_two_snapshots_only_the_pods_picked_since_are_looked_at_again():
    slots = AdapterSlots()
    pool = pods(("a", set()), ("b", set()))
    positions = {p.address: i for i, p in enumerate(pool)}

    def unseen(at: float) -> Any:
        state = CycleState()
        state[POSITIONS] = positions  # the same snapshot: the same positions map
        slots.prepare(SchedulingRequest("q", critical=True), pool, state, at)
        return {a: set(s) for a, s in state.get(UNSEEN_ADAPTERS, {}).items()}

    pick(slots, "x", "a", 10.01)
    assert unseen(10.02) == {"a": {"x"}}
    pick(slots, "y", "b", 10.03)
    pick(slots, "z", "a", 10.04)
    assert unseen(10.05) == {"a": {"x", "z"}, "b": {"y"}}
    # A new snapshot scraped at 10.045: what it saw is forgotten, the pick after it kept.
    pick(slots, "w", "b", 10.05)
    scraped = tuple(pod(max_lora=2, address=a, updated_at=10.045) for a in ("a", "b"))
    state = CycleState()
    state[POSITIONS] = {p.address: i for i, p in enumerate(scraped)}
    slots.prepare(SchedulingRequest("q", critical=True), scraped, state, 10.06)
    assert {a: set(s) for a, s in state[UNSEEN_ADAPTERS].items()} == {"b": {"w"}}


def test_a_pod_that_leaves_the_candidates_is_forgotten():
    slots = AdapterSlots()
    prepare(slots, "x", 9.0, pods(("a", set()), ("c", {"x"})))
    pick(slots, "x", "a", 5.0)
    prepare(slots, "q", 9.5, pods(("c", set())))  # a gone (left the pool, or stale)
    # Back with the same address: nothing is known of its slots.
    assert RESIDENT not in prepare(slots, "x", 10.01, pods(("a", set()), ("c", set())))


def test_the_targets_taken_for_base_models_are_bounded(monkeypatch):
    monkeypatch.setattr(adapter_slots, "MAX_BASE_TARGETS", 2)
    slots = AdapterSlots()
    pool = pods(("a", set()))
    for key, target in enumerate(["m1", "m2", "m3"]):
        pick(slots, target, "a", 9.9 + key * 0.001, key)  # scraped at 10.0 and not shown: base
    prepare(slots, "q", 10.01, pool)
    # m1, the oldest, was forgotten: sent again after the scrape it counts as unseen.
    for key, target in enumerate(["m1", "m3"], start=10):
        pick(slots, target, "a", 10.02, key)
    assert prepare(slots, "q", 10.03, pool)[UNSEEN_ADAPTERS] == {"a": frozenset({"m1"})}
