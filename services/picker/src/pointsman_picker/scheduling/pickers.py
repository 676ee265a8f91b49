"""The pickers: the pod a request goes to, from the pods the filters kept and their scores."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

from pointsman_picker.scheduling.contracts import Picker
from pointsman_picker.scheduling.types import CycleState, Pods
from pointsman_shared.snapshot import PodSnapshot


@dataclass(frozen=True, slots=True)
class RandomPicker(Picker):
    """Any pod, uniformly (the scores, if any, are not read)."""

    type_name: ClassVar[str] = "random-picker"

    def __call__(
        self, pods: Pods, scores: list[float] | None, state: CycleState, rng: random.Random
    ) -> PodSnapshot:
        return pods[rng.randrange(len(pods))]


@dataclass(frozen=True, slots=True)
class MaxScorePicker(Picker):
    """The highest total score; ties broken at random (uniformly without scores)."""

    type_name: ClassVar[str] = "max-score-picker"

    def __call__(
        self, pods: Pods, scores: list[float] | None, state: CycleState, rng: random.Random
    ) -> PodSnapshot:
        if scores is None:
            return pods[rng.randrange(len(pods))]
        best = max(scores)
        top = [pod for pod, score in zip(pods, scores, strict=True) if score == best]
        return top[rng.randrange(len(top))]
