"""Scheduling plugins, as upstream's later framework has them: filters, scorers (score in [0, 1],
weighted), a picker; declared by ``type`` in the config's ``plugins`` and put together by ``profiles``.

Every filter is a :class:`Node`, so the #423 tree is one plugin of type ``decision-tree`` whose
``tree`` parameter wires other filters by name (``filter``, ``onSuccess``, ``onFailure``,
``onSuccessOrFailure``; ``drop`` ends in a 429). Thresholds default to the config's ``scheduling``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pointsman_picker.scheduling.filters import (
    Drop,
    FilterFn,
    Node,
    critical_request,
    has_capacity,
    least_kv_cache,
    least_queuing,
    least_work,
    lora_soft_affinity,
    lora_spread_affinity,
    low_queueing,
)
from pointsman_picker.scheduling.tree import DROP_SHEDDABLE
from pointsman_picker.scheduling.types import Pods, SchedulingRequest
from pointsman_shared.config import SchedulingConfig
from pointsman_shared.snapshot import PodSnapshot

Scorer = Callable[[SchedulingRequest, Pods], list[float]]  # one score per pod, in [0, 1]
Picker = Callable[[Pods, list[float] | None, random.Random], PodSnapshot]


class PluginError(ValueError):
    """A plugin or profile cannot be built; ``path`` names the bad config value."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


@dataclass(frozen=True, slots=True)
class Plugin:
    name: str
    filter: Node | None = None
    scorer: Scorer | None = None
    picker: Picker | None = None


# -- scorers (spec §6) ------------------------------------------------------------------------------
def queue_scorer(request: SchedulingRequest, pods: Pods) -> list[float]:
    """``(maxQ - q) / (maxQ - minQ)``; every pod 1.0 when all queues are equal."""
    waiting = [pod.waiting for pod in pods]
    low, high = min(waiting, default=0), max(waiting, default=0)
    if high == low:
        return [1.0] * len(pods)
    return [(high - q) / (high - low) for q in waiting]


def kv_cache_scorer(request: SchedulingRequest, pods: Pods) -> list[float]:
    return [1.0 - pod.kv_cache_usage for pod in pods]


def lora_affinity_scorer(request: SchedulingRequest, pods: Pods) -> list[float]:
    """1.0 adapter running, 0.8 a free adapter slot, 0.6 adapter waiting, else 0."""
    target = request.target_model
    if target is None:
        return [0.0] * len(pods)
    scores = []
    for pod in pods:
        if target in pod.running_adapters:
            scores.append(1.0)
        elif len(pod.active_adapters) < pod.max_lora:
            scores.append(0.8)
        elif target in pod.waiting_adapters:
            scores.append(0.6)
        else:
            scores.append(0.0)
    return scores


# -- pickers ----------------------------------------------------------------------------------------
def random_picker(pods: Pods, scores: list[float] | None, rng: random.Random) -> PodSnapshot:
    return pods[rng.randrange(len(pods))]


def max_score_picker(pods: Pods, scores: list[float] | None, rng: random.Random) -> PodSnapshot:
    """The highest total score; ties broken at random."""
    if scores is None:
        return random_picker(pods, scores, rng)
    best = max(scores)
    top = [pod for pod, score in zip(pods, scores, strict=True) if score == best]
    return top[rng.randrange(len(top))]


# -- building ---------------------------------------------------------------------------------------
def _params(path: str, given: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise PluginError(
            f"{path}.{unknown[0]}", f"unknown parameter (known: {', '.join(defaults) or 'none'})"
        )
    values = {**defaults, **given}
    for key, value in values.items():
        default = defaults[key]
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise PluginError(f"{path}.{key}", f"must be a number, not {value!r}")
            if value < 0:
                raise PluginError(f"{path}.{key}", "must not be negative")
    return values


# least-work-filter's defaults: milliseconds of a vLLM step of Llama-3.1-8B on an H100 (the simulator's
# llama-3.1-8b-h100 profile, docs/simulator.md): 29k prompt tokens/s, 0.04 ms per decoding sequence,
# 4.7e-5 ms per KV-cache token of 424k; a pod within a millisecond of the least counts as least.
DEFAULT_PER_PENDING_TOKEN = 1000.0 / 29_000.0
DEFAULT_PER_RUNNING = 0.04
DEFAULT_PER_KV_CACHE = 26_500 * 16 * 4.7e-5
DEFAULT_WORK_TOLERANCE = 1.0

FilterFactory = Callable[[dict[str, Any]], FilterFn]


def _filter_types(config: SchedulingConfig) -> dict[str, tuple[dict[str, Any], FilterFactory]]:
    return {
        "critical-request-filter": ({}, lambda p: critical_request),
        "low-queue-filter": (
            {"threshold": config.queueing_threshold_lora},
            lambda p: low_queueing(int(p["threshold"])),
        ),
        "has-capacity-filter": (
            {
                "queueThreshold": config.queue_threshold_critical,
                "kvCacheThreshold": config.kv_cache_threshold,
            },
            lambda p: has_capacity(int(p["queueThreshold"]), float(p["kvCacheThreshold"])),
        ),
        "least-queue-filter": ({}, lambda p: least_queuing),
        "least-kv-cache-filter": ({}, lambda p: least_kv_cache),
        "least-work-filter": (
            {
                "perPendingToken": DEFAULT_PER_PENDING_TOKEN,
                "perRunning": DEFAULT_PER_RUNNING,
                "perKvCache": DEFAULT_PER_KV_CACHE,
                "perWaiting": 0.0,
                "tolerance": DEFAULT_WORK_TOLERANCE,
            },
            lambda p: least_work(
                float(p["perPendingToken"]),
                float(p["perRunning"]),
                float(p["perKvCache"]),
                float(p["perWaiting"]),
                float(p["tolerance"]),
            ),
        ),
        "lora-spread-affinity-filter": (
            {
                "threshold": config.lora_affinity_threshold,
                "spreadRatio": 0.1,
                "spreadMargin": 8.0,
                "maxAdapterShare": 0.75,
            },
            lambda p: lora_spread_affinity(
                float(p["threshold"]),
                float(p["spreadRatio"]),
                float(p["spreadMargin"]),
                float(p["maxAdapterShare"]),
            ),
        ),
        "lora-affinity-filter": (
            {"threshold": config.lora_affinity_threshold},
            lambda p: lora_soft_affinity(float(p["threshold"])),
        ),
    }


SCORERS: dict[str, Scorer] = {
    "queue-scorer": queue_scorer,
    "kv-cache-scorer": kv_cache_scorer,
    "lora-affinity-scorer": lora_affinity_scorer,
}
PICKERS: dict[str, Picker] = {"random-picker": random_picker, "max-score-picker": max_score_picker}


def build_plugins(
    specs: Sequence[tuple[str, str, Mapping[str, Any]]], config: SchedulingConfig
) -> dict[str, Plugin]:
    """``specs`` are ``(name, type, parameters)``, indexed as ``plugins[i]`` in errors. Decision trees
    may refer to any filter declared before or after them."""
    filter_types = _filter_types(config)
    plugins: dict[str, Plugin] = {}
    trees: list[tuple[int, str, Mapping[str, Any]]] = []
    for i, (name, kind, params) in enumerate(specs):
        path = f"plugins[{i}]"
        if name in plugins or any(name == t[1] for t in trees):
            raise PluginError(f"{path}.name", f"{name!r} is declared twice")
        if kind in filter_types:
            defaults, factory = filter_types[kind]
            plugins[name] = Plugin(
                name, filter=Node(name, factory(_params(f"{path}.parameters", params, defaults)))
            )
        elif kind in SCORERS:
            _params(f"{path}.parameters", params, {})
            plugins[name] = Plugin(name, scorer=SCORERS[kind])
        elif kind in PICKERS:
            _params(f"{path}.parameters", params, {})
            plugins[name] = Plugin(name, picker=PICKERS[kind])
        elif kind == "decision-tree":
            _params(f"{path}.parameters", params, {"tree": None})
            trees.append((i, name, params))
        else:
            known = ", ".join([*filter_types, *SCORERS, *PICKERS, "decision-tree"])
            raise PluginError(f"{path}.type", f"unknown plugin type {kind!r} (known: {known})")
    for i, name, params in trees:
        root = _tree(f"plugins[{i}].parameters.tree", params.get("tree"), plugins)
        if not isinstance(root, Node):
            raise PluginError(f"plugins[{i}].parameters.tree", "must start with a filter")
        plugins[name] = Plugin(name, filter=root)
    return plugins


_BRANCHES = ("onSuccess", "onFailure", "onSuccessOrFailure")


def _tree(path: str, spec: Any, plugins: Mapping[str, Plugin]) -> Node | Drop | None:
    if spec is None:
        return None
    if spec == "drop":
        return DROP_SHEDDABLE
    if not isinstance(spec, Mapping):
        raise PluginError(path, "must be a mapping with `filter`, or `drop`")
    unknown = sorted(set(spec) - {"filter", *_BRANCHES})
    if unknown:
        raise PluginError(f"{path}.{unknown[0]}", f"unknown key (known: filter, {', '.join(_BRANCHES)})")
    ref = spec.get("filter")
    plugin = plugins.get(ref) if isinstance(ref, str) else None
    if plugin is None or plugin.filter is None:
        raise PluginError(f"{path}.filter", f"{ref!r} is not a declared filter plugin")
    name = plugin.name
    if "onSuccessOrFailure" in spec and ("onSuccess" in spec or "onFailure" in spec):
        raise PluginError(f"{path}.onSuccessOrFailure", "use it alone, or onSuccess/onFailure")
    either = _tree(f"{path}.onSuccessOrFailure", spec.get("onSuccessOrFailure"), plugins)
    success = _tree(f"{path}.onSuccess", spec.get("onSuccess"), plugins) or either
    failure = _tree(f"{path}.onFailure", spec.get("onFailure"), plugins) or either
    return Node(name, plugin.filter.filter, on_success=success, on_failure=failure)
