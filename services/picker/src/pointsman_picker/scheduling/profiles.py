"""Scheduling profiles: filters in order, then weighted scorers (each clamped to [0, 1]), then a picker.

Two are built in: ``default`` (the #423 tree, then a uniform pick, exactly as upstream at #423) and
``scorer`` (queue, KV-cache and LoRA-affinity scorers, weight 1 each, then the highest score). A
profile of the same name in the config replaces a built-in one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from pointsman_picker.scheduling.contracts import Picker, Scorer
from pointsman_picker.scheduling.pickers import MaxScorePicker, RandomPicker
from pointsman_picker.scheduling.plugins import PluginError, build_plugins
from pointsman_picker.scheduling.scorers import KvCacheScorer, LoraAffinityScorer, QueueScorer
from pointsman_picker.scheduling.tree import Node, StepSink, build_tree, reads_pending_prefill, run_tree
from pointsman_picker.scheduling.types import Drop, Pods, SchedulingRequest
from pointsman_shared.config import PointsmanConfig
from pointsman_shared.snapshot import PodSnapshot

DEFAULT = "default"
SCORER = "scorer"


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    filters: tuple[Node, ...]
    scorers: tuple[tuple[str, float, Scorer], ...]
    picker: Picker

    @property
    def uses_pending_prefill(self) -> bool:
        """Whether a filter reads the request's ``pending_prefill`` (the director works it out only then)."""
        return any(reads_pending_prefill(node) for node in self.filters)

    def schedule(
        self, request: SchedulingRequest, pods: Pods, rng: random.Random, on_step: StepSink | None = None
    ) -> PodSnapshot | Drop:
        for node in self.filters:
            result = run_tree(node, request, pods, rng, on_step)
            if isinstance(result, Drop):
                return result
            if not result:
                return Drop(f"no pod left after {node.name}")
            pods = result
        scores: list[float] | None = None
        if self.scorers:
            scores = [0.0] * len(pods)
            for _, weight, scorer in self.scorers:
                for i, score in enumerate(scorer(request, pods)):
                    scores[i] += weight * min(1.0, max(0.0, score))
        return self.picker.__call__(pods, scores, rng)  # the method: see run_tree


def builtin_profiles(config: PointsmanConfig) -> dict[str, Profile]:
    scorers: tuple[tuple[str, float, Scorer], ...] = tuple(
        (scorer.type_name, 1.0, scorer) for scorer in (QueueScorer(), KvCacheScorer(), LoraAffinityScorer())
    )
    return {
        DEFAULT: Profile(DEFAULT, (build_tree(config.scheduling),), (), RandomPicker()),
        SCORER: Profile(SCORER, (), scorers, MaxScorePicker()),
    }


def build_profile(config: PointsmanConfig) -> Profile:
    """The profile ``picker.profile`` names; :class:`PluginError` names the bad config path."""
    specs = [(p.ref, p.type, p.parameters) for p in config.plugins]
    plugins = build_plugins(specs, config.scheduling)
    profiles = builtin_profiles(config)
    for i, spec in enumerate(config.profiles):
        filters: list[Node] = []
        scorers: list[tuple[str, float, Scorer]] = []
        picker: Picker | None = None
        for j, entry in enumerate(spec.plugins):
            path = f"profiles[{i}].plugins[{j}].pluginRef"
            plugin = plugins.get(entry.plugin_ref)
            if plugin is None:
                raise PluginError(path, f"no plugin named {entry.plugin_ref!r} in plugins")
            if plugin.filter is not None:
                if scorers or picker is not None:
                    raise PluginError(path, "filters come before scorers and the picker")
                filters.append(plugin.filter)
            elif plugin.scorer is not None:
                if picker is not None:
                    raise PluginError(path, "scorers come before the picker")
                scorers.append((plugin.name, entry.weight, plugin.scorer))
            elif plugin.picker is not None:
                if picker is not None:
                    raise PluginError(path, "a profile has one picker")
                picker = plugin.picker
        profiles[spec.name] = Profile(
            spec.name,
            tuple(filters),
            tuple(scorers),
            picker or (MaxScorePicker() if scorers else RandomPicker()),
        )
    chosen = profiles.get(config.picker.profile)
    if chosen is None:
        raise PluginError(
            "picker.profile", f"no profile {config.picker.profile!r} (have: {', '.join(profiles)})"
        )
    return chosen
