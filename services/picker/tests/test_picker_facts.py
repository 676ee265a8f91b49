"""The plain view of the pods' facts, one question per row; and which view a tuple of pods is read
through. (The indexed view answers every question as this one: test_picker_indexed.py.)"""

from __future__ import annotations

import pytest
from picker_builders import pod

from pointsman_picker.scheduling.facts import PLAIN
from pointsman_picker.scheduling.indexed import IndexedPods, facts_of

A = pod(3, 0.5, 2, {"x"}, address="a", running=10)
B = pod(0, 0.9, 1, {"y"}, address="b", running=2, waiting_adapters={"z"})  # z waits for a slot
C = pod(7, 0.1, 2, address="c")
PODS = (A, B, C)


@pytest.mark.parametrize(
    ("question", "pods", "args", "expected"),
    [
        ("waiting", PODS, (), [3, 0, 7]),
        ("max_waiting", PODS, (), 7),
        ("max_waiting", (), (), 0),
        ("waiting_range", PODS, (), (0, 7)),
        ("waiting_range", (), (), (0, 0)),
        ("waiting_at_most", PODS, (3,), (A, B)),
        ("kv", PODS, (), [0.5, 0.9, 0.1]),
        ("kv_range", PODS, (), (0.1, 0.9)),
        ("kv_range", (), (), (0.0, 0.0)),
        ("kv_at_most", PODS, (0.5,), (A, C)),
        ("capacity", PODS, (3, 0.8), (A,)),  # both limits hold
        ("lora", PODS, ("x",), ([0], [2])),  # x active; then the free slots
        ("lora", PODS, ("z",), ([1], [0, 2])),  # a waiting adapter is active
        ("lora", PODS, (None,), ([], [0, 2])),
        ("take", PODS, ([0, 2],), (A, C)),
        ("least_load", PODS, ([0, 2],), 7),
        ("total_load", PODS, (), 22),
        ("slots", PODS, (), 5),
        ("starved", PODS, (), True),
        ("starved", (A, C), (), False),
        ("select", PODS, ([0, 1, 1],), (B, C)),
    ],
)
def test_plain_facts(question, pods, args, expected):
    assert getattr(PLAIN, question)(pods, *args) == expected


def test_what_keeps_pods_keeps_a_plain_tuple():
    assert type(PLAIN.take(IndexedPods(PODS), [0])) is tuple
    assert type(PLAIN.select(IndexedPods(PODS), [1, 1, 1])) is tuple


def test_pods_are_read_through_their_own_facts_or_the_plain_view():
    indexed = IndexedPods(PODS)
    assert facts_of(indexed) is indexed.facts
    assert facts_of(PODS) is PLAIN
    assert facts_of(()) is PLAIN
