"""The count of distinct target models routed lately; as a request plugin."""

from __future__ import annotations

import pytest
from picker_builders import pod

from pointsman_picker.scheduling import CycleState, SchedulingRequest
from pointsman_picker.scheduling.recent_targets import RECENT_TARGETS, RecentTargets


def test_recent_targets_count_the_distinct_targets_within_the_window():
    targets = RecentTargets(10.0)
    assert [targets.seen(t, at) for t, at in [("a", 0.0), ("a", 1.0), ("b", 2.0), (None, 3.0)]] == [
        1,
        1,
        2,
        3,
    ]
    # "a" (1.0) and "b" (2.0) are older than the window at 12.5: the others and "c" are left.
    assert targets.seen("c", 12.5) == 2
    assert targets.seen("c", 20.0) == 1
    with pytest.raises(ValueError, match="positive"):
        RecentTargets(0)


def test_as_a_request_plugin_it_counts_each_request_at_prepare():
    targets = RecentTargets(10.0)
    pods = (pod(address="a"),)
    counts = []
    for target, at in [("a", 0.0), ("b", 1.0), ("a", 2.0)]:
        state = CycleState()
        assert targets.prepare(SchedulingRequest(target, critical=True), pods, state, at) is pods
        counts.append(state[RECENT_TARGETS])
    assert counts == [1, 2, 2]
