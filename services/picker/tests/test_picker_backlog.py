"""The prefill backlog: prompt tokens sent to each pod, drained at a rate; as a request plugin."""

from __future__ import annotations

import pytest
from picker_builders import pod

from pointsman_picker.scheduling import CycleState, SchedulingRequest, Ticket
from pointsman_picker.scheduling.backlog import PENDING_PREFILL, PROMPT_TOKENS, PrefillBacklog


@pytest.mark.parametrize(
    ("name", "records", "at", "expected"),
    [
        ("nothing recorded", [], 0.0, {}),
        ("drains at the rate", [("a", 1000, 0.0)], 0.02, {"a": 800.0}),
        ("adds up", [("a", 1000, 0.0), ("a", 500, 0.01)], 0.01, {"a": 1400.0}),
        ("never below zero, and then forgotten", [("a", 100, 0.0), ("a", 100, 1.0)], 1.05, {}),
        ("an unknown prompt adds nothing", [("a", 0, 0.0)], 0.0, {}),
        ("per pod", [("a", 1000, 0.0), ("b", 300, 0.01)], 0.01, {"a": 900.0, "b": 300.0}),
    ],
)
def test_prefill_backlog(name, records, at, expected):
    backlog = PrefillBacklog(10_000.0)
    for address, tokens, now in records:
        backlog.record(address, tokens, now)
    assert backlog.pending(at) == pytest.approx(expected), name


def test_prefill_backlog_needs_a_positive_rate():
    with pytest.raises(ValueError, match="positive"):
        PrefillBacklog(0)


def test_as_a_request_plugin_it_prepares_the_request_and_records_its_pick():
    backlog = PrefillBacklog(10_000.0)
    pods = (pod(address="a"),)
    request = SchedulingRequest("m", critical=True, body={"prompt": "x" * 4000})
    state = CycleState()
    assert backlog.prepare(request, pods, state, 0.0) is pods
    assert state[PROMPT_TOKENS] == 1000
    assert state[PENDING_PREFILL] == {}
    backlog.picked(Ticket(1, "a", 0.0), request, state)
    later = CycleState()
    backlog.prepare(SchedulingRequest("m", critical=True), pods, later, 0.05)
    assert later[PENDING_PREFILL] == pytest.approx({"a": 500.0})
    assert later[PROMPT_TOKENS] == 0  # a body without a prompt


@pytest.mark.parametrize(
    ("matched", "expected"),
    [({}, 1000.0), ({"a": 3}, 250.0), ({"a": 4}, None), ({"b": 4}, 1000.0)],
)
def test_with_a_prefix_index_only_the_uncached_share_is_pending(matched, expected):
    from pointsman_picker.scheduling.prefix_cache import PREFIX_MATCH, PrefixMatch

    backlog = PrefillBacklog(10_000.0)
    state = CycleState()
    state[PROMPT_TOKENS] = 1000
    state[PREFIX_MATCH] = PrefixMatch((1, 2, 3, 4), matched, ())
    backlog.picked(Ticket(1, "a", 0.0), SchedulingRequest("m", True), state)
    assert backlog.pending(0.0).get("a") == expected
