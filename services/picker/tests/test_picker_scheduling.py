"""The #423 filter tree (spec §5) and the scheduler: upstream's cases as tables, and the tree's walking
rules. The filters' own tables are in test_picker_filters.py."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from picker_builders import Steps, pod, run_profile, tree_profile

from pointsman_picker.scheduling import CycleState, Drop, Node, SchedulingRequest, run_tree
from pointsman_picker.scheduling.tree import DROP_SHEDDABLE, either_way
from pointsman_shared.config import SchedulingConfig

CRITICAL = SchedulingRequest(target_model="critical", critical=True)
SHEDDABLE = SchedulingRequest(target_model="critical", critical=False)

# Upstream's pods for cases 1 and 2.
P1 = pod(0, 0.2, 2, {"foo", "bar"}, address="pod1")
P2 = pod(3, 0.1, 2, {"foo", "critical"}, address="pod2")
P3 = pod(10, 0.2, 2, {"foo"}, address="pod3")


def schedule(request: SchedulingRequest, *pods, seed: int = 0):
    return run_profile(tree_profile(), request, pods, random.Random(seed))


def addresses(pods) -> list[str]:
    return [p.address for p in pods]


def test_case1_critical_prefers_the_pod_with_the_adapter():
    picks = Counter(schedule(CRITICAL, P1, P2, P3, seed=seed).address for seed in range(20_000))
    assert set(picks) <= {"pod2", "pod3"}
    share = picks["pod2"] / 20_000 * 100
    assert 99.9 - 0.2 <= share <= 100  # 99.9% expected; the rest goes to the pod with a free slot
    assert picks["pod3"] > 0


@pytest.mark.parametrize(
    ("name", "request_", "pods", "expected"),
    [
        ("2: sheddable, same pods", SHEDDABLE, (P1, P2, P3), "pod1"),
        (
            "sheddable, one pod under both thresholds",
            SHEDDABLE,
            (pod(6, 0.2, address="a"), pod(0, 0.85, address="b"), pod(4, 0.8, address="c")),
            "c",
        ),
        (
            "critical, every pod queues >= 128: least queuing runs before LoRA affinity",
            SchedulingRequest("lora", critical=True),
            (pod(300, 0.1, 2, {"lora"}, address="far"), pod(128, 0.5, 2, address="near")),
            "near",
        ),
        (
            "critical, LoRA affinity runs before least queuing",
            SchedulingRequest("lora", critical=True),
            (pod(0, 0.1, 0, address="idle"), pod(100, 0.5, 0, {"lora"}, address="has-lora")),
            "has-lora",
        ),
        (
            "critical, neither affinity nor free slot: least queuing then least KV",
            SchedulingRequest("lora", critical=True),
            (pod(0, 0.5, address="a"), pod(1, 0.1, address="b"), pod(9, 0.0, address="c")),
            "b",
        ),
    ],
)
def test_schedule_picks(name, request_, pods, expected):
    assert schedule(request_, *pods).address == expected, name


@pytest.mark.parametrize(
    "pods",
    [
        # 3: upstream's case
        (pod(10, 0.9, 2), pod(3, 0.85, 2), pod(10, 0.85, 2)),
        # on the thresholds' wrong side by one
        (pod(6, 0.0), pod(0, 0.81)),
        # no pod at all
        (),
    ],
)
def test_case3_sheddable_without_capacity_is_dropped(pods):
    assert isinstance(schedule(SHEDDABLE, *pods), Drop)
    assert schedule(SHEDDABLE, *pods) == DROP_SHEDDABLE  # the tree's own branch is the outcome


def test_critical_is_never_dropped_when_a_pod_exists():
    assert schedule(CRITICAL, pod(500, 1.0, address="busy")).address == "busy"


def test_thresholds_come_from_the_config():
    strict = SchedulingConfig(queue_threshold_critical=0, kv_cache_threshold=0.1)
    pods = (pod(1, 0.05, address="a"),)
    assert isinstance(run_profile(tree_profile(strict), SHEDDABLE, pods, random.Random(0)), Drop)
    assert run_profile(tree_profile(), SHEDDABLE, pods, random.Random(0)).address == "a"


def test_final_pick_is_uniform():
    pods = tuple(pod(address=str(i)) for i in range(4))
    picks = Counter(schedule(CRITICAL, *pods, seed=seed).address for seed in range(4000))
    assert set(picks) == {"0", "1", "2", "3"}
    assert all(800 < n < 1200 for n in picks.values())


# The walking rules of a node, on toy filters.
def keep_even(request, pods, state, rng):
    return tuple(p for p in pods if p.waiting % 2 == 0)


def keep_none(request, pods, state, rng):
    return ()


def keep_first(request, pods, state, rng):
    return pods[:1]


EVENS_THEN_FIRST = Node("evens", keep_even, on_success=Node("first", keep_first))


@pytest.mark.parametrize(
    ("name", "root", "waitings", "expected"),
    [
        ("success passes the result on", EVENS_THEN_FIRST, [1, 2, 4], [2]),
        ("failure without a branch returns the empty result", EVENS_THEN_FIRST, [1, 3], []),
        ("missing success branch returns the result", Node("evens", keep_even), [1, 2, 4], [2, 4]),
        (
            "failure passes the node's input on",
            Node("none", keep_none, on_failure=Node("first", keep_first)),
            [5, 6],
            [5],
        ),
        ("either way", either_way("none", keep_none, Node("evens", keep_even)), [1, 2], [2]),
    ],
)
def test_run_tree(name, root, waitings, expected):
    pods = tuple(pod(w) for w in waitings)
    result = run_tree(root, CRITICAL, pods, CycleState(), random.Random(0))
    assert [p.waiting for p in result] == expected, name


def test_run_tree_drop():
    root = Node("none", keep_none, on_failure=Drop("full"))
    assert run_tree(root, CRITICAL, (pod(),), CycleState(), random.Random(0)) == Drop("full")


def test_the_walk_is_reported_step_by_step():
    trace = Steps()
    pods = (pod(0, 0.2, address="a"), pod(3, 0.1, address="b"), pod(200, 0.2, address="c"))
    run_profile(tree_profile(), CRITICAL, pods, random.Random(0), trace)
    steps = trace.filters
    assert trace.steps[-1] == ("picker", "random-picker", 1)
    assert steps == [
        ("critical request", 3),
        ("low queueing", 2),
        ("LoRA soft affinity", 0),
        ("least queuing", 1),
        ("least KV cache", 1),
    ]
