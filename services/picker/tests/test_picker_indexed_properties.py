"""Properties of the two views of the pods' facts on arbitrary pods: the indexed pods' facts answer every
question exactly as the plain view does, whether worked out as asked, kept, or carried over by
``with_waiting`` through any changes; so every filter keeps the same pods, with the same draws."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from picker_builders import pod, state

from pointsman_picker.scheduling import PodFacts, Pods, SchedulingRequest
from pointsman_picker.scheduling.facts import PLAIN
from pointsman_picker.scheduling.filters import (
    CriticalRequest,
    HasCapacity,
    LeastKvCache,
    LeastQueuing,
    LeastWork,
    LoraSoftAffinity,
    LoraSpreadAffinity,
    LowQueueing,
)
from pointsman_picker.scheduling.indexed import IndexedPods, facts_of, with_waiting

ADAPTERS = ["a", "b", "c", "d"]
TARGETS = [*ADAPTERS, "other", None]
WAITING = st.sampled_from([0, 1, 3, 5, 6, 127, 128, 300]) | st.integers(0, 400)
KV = st.sampled_from([0.0, 0.3, 0.8, 0.81, 1.0]) | st.floats(0.0, 1.0)
ADAPTER_SETS = st.frozensets(st.sampled_from(ADAPTERS), max_size=3)


@st.composite
def pools(draw: st.DrawFn) -> Pods:
    """Pods around the thresholds, with and without free adapter slots, adapters waiting for one."""
    fields = draw(
        st.lists(
            st.tuples(WAITING, KV, st.integers(0, 3), ADAPTER_SETS, st.integers(0, 500), ADAPTER_SETS),
            max_size=40,
        )
    )
    return tuple(
        pod(q, kv, max_lora, running_adapters, address=f"10.0.0.{i}:8000", running=r, waiting_adapters=w)
        for i, (q, kv, max_lora, running_adapters, r, w) in enumerate(fields)
    )


def changes(n: int) -> st.SearchStrategy[dict[int, int]]:
    """Some positions' waiting up or down (assignments counted, requests ended)."""
    return st.dictionaries(st.integers(0, n - 1), WAITING, max_size=4) if n else st.just({})


REQUESTS = st.tuples(
    st.builds(
        lambda target, critical: SchedulingRequest(target, critical), st.sampled_from(TARGETS), st.booleans()
    ),
    st.builds(
        lambda pending, recent: state(pending=pending, recent_targets=recent),
        st.dictionaries(
            st.sampled_from([f"10.0.0.{i}:8000" for i in range(8)]), st.floats(0, 5000), max_size=3
        ),
        st.integers(0, 40),
    ),
)
FILTERS = [
    CriticalRequest(),
    LowQueueing(128),
    HasCapacity(5, 0.8),
    LeastQueuing(),
    LeastKvCache(),
    LoraSoftAffinity(0.5),
    LoraSpreadAffinity(0.5, 0.1, 8.0, 0.75),
    LeastWork(0.0345, 0.04, 20.0, 7.0, 3.5),
]


def positions(pods: Pods) -> list[list[int]]:
    n = len(pods)
    return [list(range(n)), [], list(range(0, n, 3)), list(range(n))[-1:]]


def masks(pods: Pods) -> list[list[int]]:
    n = len(pods)
    return [[1] * n, [0] * n, [i % 2 for i in range(n)], [i % 3 == 0 for i in range(n)]]


def lora_groups(facts: PodFacts, pods: Pods, target: str | None) -> list[Any]:
    """Each LoRA group's positions, the pods the view takes at them and their least load."""
    return [
        (list(group), facts.take(pods, group), facts.least_load(pods, group) if group else None)
        for group in facts.lora(pods, target)
    ]


# Every question of the view, asked in the ways the filters ask it; answers made comparable.
QUESTIONS: dict[str, Callable[[PodFacts, Pods], Any]] = {
    "waiting": lambda facts, pods: list(facts.waiting(pods)),
    "max_waiting": lambda facts, pods: facts.max_waiting(pods),
    "waiting_range": lambda facts, pods: facts.waiting_range(pods),
    "waiting_at_most": lambda facts, pods: [facts.waiting_at_most(pods, n) for n in (-1, 0, 5, 127, 300)],
    "kv": lambda facts, pods: list(facts.kv(pods)),
    "kv_range": lambda facts, pods: facts.kv_range(pods),
    "kv_at_most": lambda facts, pods: [facts.kv_at_most(pods, kv) for kv in (0.0, 0.3, 0.8, 1.0)],
    "capacity": lambda facts, pods: [facts.capacity(pods, *c) for c in ((5, 0.8), (0, 0.0), (300, 1.0))],
    "lora": lambda facts, pods: [lora_groups(facts, pods, target) for target in TARGETS],
    "take": lambda facts, pods: [facts.take(pods, at) for at in positions(pods)],
    "least_load": lambda facts, pods: [facts.least_load(pods, at) for at in positions(pods) if at],
    "total_load": lambda facts, pods: facts.total_load(pods),
    "slots": lambda facts, pods: facts.slots(pods),
    "starved": lambda facts, pods: facts.starved(pods),
    "select": lambda facts, pods: [facts.select(pods, mask) for mask in masks(pods)],
}
# What keeps pods keeps a plain tuple, as a filter's result is.
KEEPS_PODS = ("waiting_at_most", "kv_at_most", "capacity", "take", "select")
SOME_QUESTIONS = st.sets(st.sampled_from(sorted(QUESTIONS)))


def test_every_question_of_the_view_is_asked():
    assert set(QUESTIONS) == {name for name in dir(PodFacts) if not name.startswith("_")}


def assert_same_answers(indexed: Pods, plain: Pods) -> None:
    """The indexed pods' facts answer as the plain view does, asked twice (worked out, then kept)."""
    assert isinstance(indexed, IndexedPods)
    assert type(plain) is tuple
    assert indexed == plain
    assert facts_of(plain) is PLAIN
    for name, ask in QUESTIONS.items():
        expected = ask(PLAIN, plain)
        got = ask(facts_of(indexed), indexed)
        assert got == expected, name
        assert ask(facts_of(indexed), indexed) == expected, name
        if name in KEEPS_PODS:
            assert all(type(kept) is tuple for kept in got), name


def ask(questions: set[str], pods: Pods) -> None:
    for name in sorted(questions):
        QUESTIONS[name](facts_of(pods), pods)


@given(pools(), SOME_QUESTIONS)
def test_the_facts_answer_as_the_plain_view(pods, asked_before):
    indexed = IndexedPods(pods)
    ask(asked_before, indexed)  # some facts worked out before, the others as asked
    assert_same_answers(indexed, pods)


@given(pools(), SOME_QUESTIONS, st.data())
def test_facts_carried_over_by_with_waiting_answer_as_fresh_ones(pods, asked_before, data):
    indexed: Pods = IndexedPods(pods)
    plain = pods
    ask(asked_before, indexed)
    for step in data.draw(st.lists(st.tuples(changes(len(pods)), SOME_QUESTIONS), max_size=5)):
        change, asked_between = step
        plain = tuple(with_waiting(plain, change))
        indexed = with_waiting(indexed, change)
        ask(asked_between, indexed)  # facts asked between changes are carried over, the rest not
    assert_same_answers(indexed, plain)


@given(pools(), REQUESTS, SOME_QUESTIONS, st.integers(0, 2**32))
def test_every_filter_keeps_the_same_pods_with_the_same_draws(pods, request_and_state, asked_before, seed):
    request, cycle = request_and_state
    indexed = IndexedPods(pods)
    ask(asked_before, indexed)
    for filter_ in FILTERS:
        a, b = random.Random(seed), random.Random(seed)
        kept = filter_(request, indexed, cycle, a)
        assert kept == filter_(request, pods, cycle, b), filter_
        assert a.random() == b.random(), filter_  # as many draws
        # What a filter keeps is plain (facts would not fit it), unless it keeps every pod.
        assert type(kept) is tuple or kept is indexed, filter_
