"""The one-line description of a decision, and the time each step took."""

from __future__ import annotations

import itertools

import pytest

from pointsman_picker.explain import DecisionTrace


def trace_of(*steps: tuple[str, int]) -> DecisionTrace:
    ticks = itertools.count()
    trace = DecisionTrace(lambda: float(next(ticks)))
    for name, kept in steps:
        trace(name, kept)
    return trace


def test_each_step_is_timed_from_the_one_before():
    trace = trace_of(("a", 3), ("b", 1))
    assert trace.steps == [("a", 3, 1.0), ("b", 1, 1.0)]


@pytest.mark.parametrize(
    ("recent", "stale", "head"),
    [(0, False, "pods=3"), (2, False, "pods=3 (+2 recent)"), (0, True, "pods=3 stale")],
)
def test_describe(recent, stale, head):
    text = trace_of(("a", 3), ("b", 1)).describe(pods=3, recent=recent, stale=stale, outcome="picked x")
    assert text == f"{head}; a:3 > b:1; picked x"
