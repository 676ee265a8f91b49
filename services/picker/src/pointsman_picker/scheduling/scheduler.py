"""The scheduler the director calls: one profile (by default the #423 tree, then a uniform pick)."""

from __future__ import annotations

import random

from pointsman_picker.scheduling.indexed import IndexedPods, indexed
from pointsman_picker.scheduling.pickers import RandomPicker
from pointsman_picker.scheduling.profiles import DEFAULT, Profile
from pointsman_picker.scheduling.tree import Node, StepSink, build_tree
from pointsman_picker.scheduling.types import Drop, Pods, SchedulingRequest
from pointsman_shared.config import SchedulingConfig
from pointsman_shared.snapshot import PodSnapshot


class Scheduler:
    def __init__(
        self,
        config: SchedulingConfig,
        rng: random.Random,
        *,
        root: Node | None = None,
        profile: Profile | None = None,
    ) -> None:
        if profile is None:
            profile = Profile(
                DEFAULT, (root if root is not None else build_tree(config),), (), RandomPicker()
            )
        self.profile = profile
        self._rng = rng
        # The last plain pods scheduled, indexed: a caller that passes the same pods again (the pods
        # of one snapshot) gets the facts worked out for them once.
        self._plain: Pods = ()
        self._indexed: Pods = ()

    def schedule(
        self, request: SchedulingRequest, pods: Pods, on_step: StepSink | None = None
    ) -> PodSnapshot | Drop:
        if pods is self._plain:
            pods = self._indexed
        elif not isinstance(pods, IndexedPods):
            self._plain = pods
            pods = self._indexed = indexed(pods)
        return self.profile.schedule(request, pods, self._rng, on_step)
