"""The scorers (spec §6), one table each, and their type names."""

from __future__ import annotations

import pytest
from picker_builders import pod

from pointsman_picker.scheduling import CycleState, SchedulingRequest
from pointsman_picker.scheduling.indexed import IndexedPods
from pointsman_picker.scheduling.scorers import KvCacheScorer, LoraAffinityScorer, QueueScorer

REQUEST = SchedulingRequest("x", critical=True)


@pytest.mark.parametrize(
    ("scorer", "type_name"),
    [
        (QueueScorer(), "queue-scorer"),
        (KvCacheScorer(), "kv-cache-scorer"),
        (LoraAffinityScorer(), "lora-affinity-scorer"),
    ],
)
def test_each_scorer_has_a_type_name(scorer, type_name):
    assert scorer.type_name == type_name


@pytest.mark.parametrize(
    ("waiting", "scores"), [((0, 5, 10), [1.0, 0.5, 0.0]), ((3, 3), [1.0, 1.0]), ((), [])]
)
def test_queue_scorer(waiting, scores):
    pods = tuple(pod(q) for q in waiting)
    assert QueueScorer()(REQUEST, pods, CycleState()) == scores
    assert QueueScorer()(REQUEST, IndexedPods(pods), CycleState()) == scores  # read through the pods' facts


def test_kv_cache_scorer():
    pods = (pod(kv=0.25), pod(kv=1.0))
    assert KvCacheScorer()(REQUEST, pods, CycleState()) == [0.75, 0.0]
    assert KvCacheScorer()(REQUEST, IndexedPods(pods), CycleState()) == [0.75, 0.0]


@pytest.mark.parametrize(
    ("candidate", "score"),
    [
        (pod(max_lora=1, adapters={"x"}), 1.0),
        (pod(max_lora=2, adapters={"y"}), 0.8),
        (pod(max_lora=1, waiting_adapters={"x"}), 0.6),
        (pod(max_lora=1, adapters={"y"}), 0.0),
    ],
)
def test_lora_affinity_scorer(candidate, score):
    assert LoraAffinityScorer()(REQUEST, (candidate,), CycleState()) == [score]
    assert LoraAffinityScorer()(SchedulingRequest(None, critical=True), (candidate,), CycleState()) == [0.0]
