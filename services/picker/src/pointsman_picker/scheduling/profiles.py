"""Scheduling profiles: filters in order, then weighted scorers (each clamped to [0, 1]), then a picker,
with the request lifecycle of their plugins.

Two are built in: ``default`` (the #423 tree, then a uniform pick, exactly as upstream at #423) and
``scorer`` (queue, KV-cache and LoRA-affinity scorers, weight 1 each, then the highest score). A
profile of the same name in the config replaces a built-in one.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pointsman_picker.scheduling.assignments import POSITIONS
from pointsman_picker.scheduling.contracts import DataKeys, Picker, RequestPlugin, Scorer
from pointsman_picker.scheduling.lifecycle import Lifecycle, LifecycleError, order
from pointsman_picker.scheduling.pickers import MaxScorePicker, RandomPicker
from pointsman_picker.scheduling.registry import (
    PluginError,
    build_plugins,
    build_request_plugin,
    producer_of,
    request_plugin_params,
)
from pointsman_picker.scheduling.scorers import KvCacheScorer, LoraAffinityScorer, QueueScorer
from pointsman_picker.scheduling.tree import Node, build_tree, run_tree, tree_filters
from pointsman_picker.scheduling.types import CycleState, DataKey, Drop, Pods, SchedulingRequest
from pointsman_shared.config import PointsmanConfig
from pointsman_shared.snapshot import PodSnapshot

DEFAULT = "default"
SCORER = "scorer"

# What the director gives every request's cycle state before the plugins prepare.
GIVEN: DataKeys = (POSITIONS,)

Reuse = Mapping[tuple[str, str], RequestPlugin]


class Trace(Protocol):
    """Told each step of a decision, in order (to explain it, to time the plugins)."""

    def __call__(self, name: str, kept: int) -> None:
        """A filter kept ``kept`` pods."""

    def scored(self, name: str, weight: float, scores: Sequence[float]) -> None:
        """A scorer scored the pods (clamped to [0, 1], before its weight)."""

    def chose(self, name: str, pods: Pods, pod: PodSnapshot) -> None:
        """The picker chose ``pod`` of ``pods``."""


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    filters: tuple[Node, ...]
    scorers: tuple[tuple[str, float, Scorer], ...]
    picker: Picker
    picker_name: str = ""  # the picker's plugin name (its type name when it was not declared)
    lifecycle: Lifecycle = field(default_factory=lambda: Lifecycle(()))

    def consumes(self) -> DataKeys:
        """What the profile's filters, scorers and picker read of the cycle state."""
        keys: list[DataKey[Any]] = []
        for node in self.filters:
            for filter in tree_filters(node):
                keys += filter.consumes
        for _, _, scorer in self.scorers:
            keys += scorer.consumes
        return (*keys, *self.picker.consumes)

    def request_plugins(self) -> list[RequestPlugin]:
        """The profile's filters, scorers and picker that are lifecycle plugins too."""
        parts: list[object] = [f for node in self.filters for f in tree_filters(node)]
        parts += [scorer for _, _, scorer in self.scorers]
        parts.append(self.picker)
        return [part for part in parts if isinstance(part, RequestPlugin)]

    def schedule(
        self,
        request: SchedulingRequest,
        pods: Pods,
        state: CycleState,
        rng: random.Random,
        trace: Trace | None = None,
    ) -> PodSnapshot | Drop:
        for node in self.filters:
            result = run_tree(node, request, pods, state, rng, trace)
            if isinstance(result, Drop):
                return result
            if not result:
                return Drop(f"no pod left after {node.name}")
            pods = result
        scores: list[float] | None = None
        if self.scorers:
            scores = [0.0] * len(pods)
            for name, weight, scorer in self.scorers:
                clamped = [min(1.0, max(0.0, score)) for score in scorer.__call__(request, pods, state)]
                if trace is not None:
                    trace.scored(name, weight, clamped)
                for i, score in enumerate(clamped):
                    scores[i] += weight * score
        pod = self.picker.__call__(pods, scores, state, rng)  # the method: see run_tree
        if trace is not None:
            trace.chose(self.picker_name or self.picker.type_name, pods, pod)
        return pod


def builtin_profiles(config: PointsmanConfig) -> dict[str, Profile]:
    scorers: tuple[tuple[str, float, Scorer], ...] = tuple(
        (scorer.type_name, 1.0, scorer) for scorer in (QueueScorer(), KvCacheScorer(), LoraAffinityScorer())
    )
    return {
        DEFAULT: Profile(DEFAULT, (build_tree(config.scheduling),), (), RandomPicker()),
        SCORER: Profile(SCORER, (), scorers, MaxScorePicker()),
    }


def build_profile(config: PointsmanConfig, reuse: Reuse | None = None) -> Profile:
    """The profile ``picker.profile`` names, with its lifecycle: the request plugins among its parts,
    the producers of what they consume, and the picker's recent assignments when
    ``picker.countAssignments``. A plugin of ``reuse`` (the running profile's, by spec) is kept where
    the same spec is built again. :class:`PluginError` names the bad config path."""
    reuse = reuse or {}
    specs = [(p.ref, p.type, p.parameters) for p in config.plugins]
    plugins = build_plugins(specs, config.scheduling, reuse)
    profiles = builtin_profiles(config)
    for i, spec in enumerate(config.profiles):
        filters: list[Node] = []
        scorers: list[tuple[str, float, Scorer]] = []
        picker: Picker | None = None
        picker_name = ""
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
                picker, picker_name = plugin.picker, plugin.name
        profiles[spec.name] = Profile(
            spec.name,
            tuple(filters),
            tuple(scorers),
            picker or (MaxScorePicker() if scorers else RandomPicker()),
            picker_name,
        )
    chosen = profiles.get(config.picker.profile)
    if chosen is None:
        raise PluginError(
            "picker.profile", f"no profile {config.picker.profile!r} (have: {', '.join(profiles)})"
        )
    params = request_plugin_params(config)
    parts = chosen.request_plugins()
    if config.picker.count_assignments:
        parts.insert(0, build_request_plugin("recent-assignments", params, reuse))
    try:
        ordered = order(parts, chosen.consumes(), lambda key: producer_of(key, params, reuse), given=GIVEN)
    except LifecycleError as exc:
        raise PluginError(f"profiles[{chosen.name}]", str(exc)) from None
    return Profile(
        chosen.name, chosen.filters, chosen.scorers, chosen.picker, chosen.picker_name, Lifecycle(ordered)
    )
