"""The one-line description of a decision, and the time each step took."""

from __future__ import annotations

import itertools

import pytest
from picker_builders import pod

from pointsman_picker.explain import DecisionTrace


def trace_of(*steps: tuple[str, int]) -> DecisionTrace:
    ticks = itertools.count()
    trace = DecisionTrace(lambda: float(next(ticks)))
    for name, kept in steps:
        trace(name, kept)
    return trace


def test_each_step_is_timed_from_the_one_before():
    trace = trace_of(("a", 3), ("b", 1))
    assert trace.steps == [("filter", "a", 3, 1.0), ("filter", "b", 1, 1.0)]


@pytest.mark.parametrize(
    ("notes", "stale", "head"),
    [
        ([], False, "pods=3"),
        (["+2 recent"], False, "pods=3 (+2 recent)"),
        (["+2 recent", "prefix 3/4"], False, "pods=3 (+2 recent) (prefix 3/4)"),
        ([], True, "pods=3 stale"),
    ],
)
def test_describe(notes, stale, head):
    text = trace_of(("a", 3), ("b", 1)).describe(pods=3, notes=notes, stale=stale, outcome="picked x")
    assert text == f"{head}; a:3 > b:1; picked x"


def test_scorers_show_the_picked_pods_score_and_the_picker_how_many_it_chose_from():
    pods = (pod(address="a"), pod(address="b"))
    trace = trace_of(("a", 2))
    trace.scored("queue", 2.0, [1.0, 0.25])
    trace.scored("kv", 1.0, [0.5, 0.125])
    trace.chose("max-score-picker", pods, pods[1])
    assert [kind for kind, *_ in trace.steps] == ["filter", "scorer", "scorer", "picker"]
    text = trace.describe(pods=2, notes=[], stale=False, outcome="picked b")
    assert text == "pods=2; a:2 > queue*2=0.25 > kv*1=0.12 > max-score-picker:2; picked b"
