"""The Accepted condition the collector writes on the pool's objects (kubernetes/cluster_watch)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pointsman_collector.kubernetes.cluster_watch import _current, _merged, accepted_condition

NOW = datetime(2026, 12, 2, 15, 0, tzinfo=UTC)
LATER = datetime(2026, 12, 2, 16, 0, tzinfo=UTC)
PENDING = {"type": "Ready", "status": "Unknown", "reason": "Pending", "message": "Waiting for controller"}


def obj(generation: int, *conditions: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "o", "generation": generation}, "status": {"conditions": list(conditions)}}


def test_accepted_or_invalid_for_the_generation() -> None:
    assert accepted_condition(obj(3), None, NOW) == {
        "type": "Accepted",
        "status": "True",
        "reason": "Accepted",
        "message": "",
        "observedGeneration": 3,
        "lastTransitionTime": "2026-12-02T15:00:00Z",
    }
    refused = accepted_condition(obj(4), "spec.rules[0]: set a weight on every target or on none", NOW)
    assert (refused["status"], refused["reason"], refused["observedGeneration"]) == ("False", "Invalid", 4)
    assert "weight" in refused["message"]


def test_the_crd_s_placeholder_goes_and_the_condition_is_written_once_per_change() -> None:
    first = obj(1, PENDING)
    wanted = accepted_condition(first, None, NOW)
    assert not _current(first, wanted)
    (written,) = _merged(first, wanted)
    assert written == wanted
    # The same generation again: nothing to write; a new generation: written, and the transition time
    # stays while the status does not change.
    assert _current(obj(1, written), accepted_condition(obj(1), None, LATER))
    newer = accepted_condition(obj(2), None, LATER)
    assert not _current(obj(2, written), newer)
    (kept,) = _merged(obj(2, written), newer)
    assert (kept["observedGeneration"], kept["lastTransitionTime"]) == (2, "2026-12-02T15:00:00Z")
    (moved,) = _merged(obj(3, kept), accepted_condition(obj(3), "bad", LATER))
    assert (moved["status"], moved["lastTransitionTime"]) == ("False", "2026-12-02T16:00:00Z")
