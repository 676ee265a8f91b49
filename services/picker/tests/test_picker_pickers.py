"""The pickers, and their type names."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from picker_builders import pod

from pointsman_picker.scheduling import CycleState
from pointsman_picker.scheduling.pickers import MaxScorePicker, RandomPicker

PODS = (pod(address="a"), pod(address="b"), pod(address="c"))


@pytest.mark.parametrize(
    ("picker", "type_name"), [(RandomPicker(), "random-picker"), (MaxScorePicker(), "max-score-picker")]
)
def test_each_picker_has_a_type_name(picker, type_name):
    assert picker.type_name == type_name


def test_max_score_picker_breaks_ties_at_random():
    picks = {
        MaxScorePicker()(PODS, [1.0, 0.2, 1.0], CycleState(), random.Random(seed)).address
        for seed in range(50)
    }
    assert picks == {"a", "c"}


@pytest.mark.parametrize("picker", [RandomPicker(), MaxScorePicker()])
def test_without_scores_the_pick_is_uniform_with_one_draw(picker):
    picks = Counter(picker(PODS, None, CycleState(), random.Random(seed)).address for seed in range(3000))
    assert set(picks) == {"a", "b", "c"}
    assert all(800 < n < 1200 for n in picks.values())
    # One randrange per pick: the next draw is the one after it.
    rng, control = random.Random(7), random.Random(7)
    picker(PODS, None, CycleState(), rng)
    control.randrange(len(PODS))
    assert rng.random() == control.random()


def test_the_random_picker_ignores_the_scores():
    assert RandomPicker()(PODS, [0.0, 0.0, 9.0], CycleState(), random.Random(0)) == RandomPicker()(
        PODS, None, CycleState(), random.Random(0)
    )
