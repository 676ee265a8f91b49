"""Run the tree, then pick uniformly among what is left."""

from __future__ import annotations

import random

from pointsman_picker.scheduling.filters import Drop, Node, StepSink, run_tree
from pointsman_picker.scheduling.tree import build_tree
from pointsman_picker.scheduling.types import NoCapacity, Pods, SchedulingRequest
from pointsman_shared.config import SchedulingConfig
from pointsman_shared.snapshot import PodSnapshot


class Scheduler:
    def __init__(self, config: SchedulingConfig, rng: random.Random, *, root: Node | None = None) -> None:
        self._root = root if root is not None else build_tree(config)
        self._rng = rng

    def schedule(
        self, request: SchedulingRequest, pods: Pods, on_step: StepSink | None = None
    ) -> PodSnapshot | NoCapacity:
        result = run_tree(self._root, request, pods, self._rng, on_step)
        if isinstance(result, Drop):
            return NoCapacity(result.reason)
        if not result:
            return NoCapacity("no pod left after filtering")
        return result[self._rng.randrange(len(result))]
