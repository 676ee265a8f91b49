"""The scorers and pickers of the plugin framework (spec §6)."""

from __future__ import annotations

import random

import pytest
from picker_builders import pod

from pointsman_picker.scheduling import SchedulingRequest
from pointsman_picker.scheduling.plugins import (
    kv_cache_scorer,
    lora_affinity_scorer,
    max_score_picker,
    queue_scorer,
)

REQUEST = SchedulingRequest("x", critical=True)


@pytest.mark.parametrize(
    ("waiting", "scores"), [((0, 5, 10), [1.0, 0.5, 0.0]), ((3, 3), [1.0, 1.0]), ((), [])]
)
def test_queue_scorer(waiting, scores):
    assert queue_scorer(REQUEST, tuple(pod(q) for q in waiting)) == scores


def test_kv_cache_scorer():
    assert kv_cache_scorer(REQUEST, (pod(kv=0.25), pod(kv=1.0))) == [0.75, 0.0]


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
    assert lora_affinity_scorer(REQUEST, (candidate,)) == [score]
    assert lora_affinity_scorer(SchedulingRequest(None, critical=True), (candidate,)) == [0.0]


def test_max_score_picker_breaks_ties_at_random():
    pods = (pod(address="a"), pod(address="b"), pod(address="c"))
    picks = {max_score_picker(pods, [1.0, 0.2, 1.0], random.Random(seed)).address for seed in range(50)}
    assert picks == {"a", "c"}
