"""The plugin registry: every plugin type by its name, with its parameters' defaults and its factory,
per kind (filters, scorers, pickers, request plugins); :func:`build_plugins`, which makes the config's
``plugins``; and the producer of each kind of cycle-state data that a profile may consume without
declaring its producer (:func:`producer_of`).

Every filter plugin is a :class:`~pointsman_picker.scheduling.tree.Node`, so the #423 tree is one
plugin of type ``decision-tree`` whose ``tree`` parameter wires other filters by name (``filter``,
``onSuccess``, ``onFailure``, ``onSuccessOrFailure``; ``drop`` ends in a 429). Thresholds default to
the config's ``scheduling``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pointsman_picker.scheduling.adapter_slots import DEFAULT_DEPTH, RESIDENT, UNSEEN_ADAPTERS, AdapterSlots
from pointsman_picker.scheduling.assignments import RecentAssignments
from pointsman_picker.scheduling.backlog import PENDING_PREFILL, PROMPT_TOKENS, PrefillBacklog
from pointsman_picker.scheduling.contracts import Filter, Picker, RequestPlugin, Scorer
from pointsman_picker.scheduling.filters import (
    CriticalRequest,
    HasCapacity,
    LeastKvCache,
    LeastQueuing,
    LeastWork,
    LeastWorkWithPrefix,
    LoraSoftAffinity,
    LoraSpreadAffinity,
    LowQueueing,
    PrefixCacheAffinity,
)
from pointsman_picker.scheduling.pickers import MaxScorePicker, RandomPicker
from pointsman_picker.scheduling.prefix_cache import (
    DEFAULT_BLOCK_TOKENS,
    DEFAULT_CAPACITY,
    DEFAULT_MAX_BLOCKS,
    PREFIX_MATCH,
    PrefixCacheProducer,
)
from pointsman_picker.scheduling.recent_targets import DEFAULT_WINDOW, RECENT_TARGETS, RecentTargets
from pointsman_picker.scheduling.scorers import (
    KvCacheScorer,
    LoraAffinityScorer,
    PrefixCacheScorer,
    QueueScorer,
)
from pointsman_picker.scheduling.tree import DROP_SHEDDABLE, Node
from pointsman_picker.scheduling.types import DataKey, Drop
from pointsman_shared.config import PointsmanConfig, SchedulingConfig

T = TypeVar("T")
# By type name: the parameters' defaults (every parameter a type takes), and what makes the plugin from
# the parameters, defaults filled in.
PluginTypes = dict[str, tuple[dict[str, Any], Callable[[dict[str, Any]], T]]]
# A request plugin of the running profile by its spec (type, parameters): what a reload keeps.
Reuse = Mapping[tuple[str, str], RequestPlugin]


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


# least-work-filter's defaults: milliseconds of a vLLM step of Llama-3.1-8B on an H100 (the simulator's
# llama-3.1-8b-h100 profile, docs/simulator.md): 29k prompt tokens/s, 0.04 ms per decoding sequence,
# 4.7e-5 ms per KV-cache token of 424k; a pod within a millisecond of the least counts as least.
DEFAULT_PER_PENDING_TOKEN = 1000.0 / 29_000.0
DEFAULT_PER_RUNNING = 0.04
DEFAULT_PER_KV_CACHE = 26_500 * 16 * 4.7e-5
DEFAULT_WORK_TOLERANCE = 1.0
# least-work-filter's and least-work-prefix-filter's parameters, in their fields' order.
WORK_PARAMETERS: dict[str, Any] = {
    "perPendingToken": DEFAULT_PER_PENDING_TOKEN,
    "perRunning": DEFAULT_PER_RUNNING,
    "perKvCache": DEFAULT_PER_KV_CACHE,
    "perWaiting": 0.0,
    "tolerance": DEFAULT_WORK_TOLERANCE,
}


def _work(p: Mapping[str, Any]) -> tuple[float, float, float, float, float]:
    pending, running, kv_cache, waiting, tolerance = (float(p[key]) for key in WORK_PARAMETERS)
    return pending, running, kv_cache, waiting, tolerance


def _least_work_prefix(p: Mapping[str, Any]) -> LeastWorkWithPrefix:
    if not isinstance(p["idlePodFirst"], bool):
        raise ValueError(f"idlePodFirst must be true or false, not {p['idlePodFirst']!r}")
    return LeastWorkWithPrefix(
        *_work(p),
        float(p["heldPrefixWeight"]),
        float(p["soleHolderWeight"]),
        p["idlePodFirst"],
        float(p["coldPrefixWeight"]),
    )


def _lora_spread(p: Mapping[str, Any]) -> LoraSpreadAffinity:
    held = p["heldSpreadRatio"]  # unset (None): a held prompt spreads as any other
    if held is not None and (isinstance(held, bool) or not isinstance(held, (int, float)) or held < 0):
        raise ValueError(f"heldSpreadRatio must be a non-negative number, not {held!r}")
    return LoraSpreadAffinity(
        float(p["threshold"]),
        float(p["spreadRatio"]),
        float(p["spreadMargin"]),
        float(p["maxAdapterShare"]),
        None if held is None else float(held),
        float(p["heldSpreadMargin"]),
    )


def filter_types(config: SchedulingConfig) -> PluginTypes[Filter]:
    return {
        CriticalRequest.type_name: ({}, lambda p: CriticalRequest()),
        LowQueueing.type_name: (
            {"threshold": config.queueing_threshold_lora},
            lambda p: LowQueueing(int(p["threshold"])),
        ),
        HasCapacity.type_name: (
            {
                "queueThreshold": config.queue_threshold_critical,
                "kvCacheThreshold": config.kv_cache_threshold,
            },
            lambda p: HasCapacity(int(p["queueThreshold"]), float(p["kvCacheThreshold"])),
        ),
        LeastQueuing.type_name: ({}, lambda p: LeastQueuing()),
        LeastKvCache.type_name: ({}, lambda p: LeastKvCache()),
        LeastWork.type_name: (dict(WORK_PARAMETERS), lambda p: LeastWork(*_work(p))),
        LeastWorkWithPrefix.type_name: (
            {
                **WORK_PARAMETERS,
                "heldPrefixWeight": 1.0,
                "soleHolderWeight": 1.0,
                "idlePodFirst": False,
                "coldPrefixWeight": 1.0,
            },
            _least_work_prefix,
        ),
        LoraSpreadAffinity.type_name: (
            {
                "threshold": config.lora_affinity_threshold,
                "spreadRatio": 0.1,
                "spreadMargin": 8.0,
                "maxAdapterShare": 0.75,
                "heldSpreadRatio": None,
                "heldSpreadMargin": 8.0,
            },
            _lora_spread,
        ),
        LoraSoftAffinity.type_name: (
            {"threshold": config.lora_affinity_threshold},
            lambda p: LoraSoftAffinity(float(p["threshold"])),
        ),
        PrefixCacheAffinity.type_name: (
            {"affinityThreshold": 0.8, "explorationProbability": 0.01},
            lambda p: PrefixCacheAffinity(float(p["affinityThreshold"]), float(p["explorationProbability"])),
        ),
    }


# The prefix index's parameters, upstream's names of every release: hashBlockSize (v1.0) and blockSize
# (v1.1-v1.3) are characters, blockSizeTokens (v1.4 on) tokens; autoTune from v1.2. Upstream reads them
# from prefix-cache-scorer's parameters (v1.5 on also from approx-prefix-cache-producer's).
PREFIX_PARAMETERS: dict[str, Any] = {
    "autoTune": True,
    "blockSizeTokens": DEFAULT_BLOCK_TOKENS,
    "blockSize": 0,
    "hashBlockSize": 0,
    "maxPrefixBlocksToMatch": DEFAULT_MAX_BLOCKS,
    "maxPrefixTokensToMatch": 0,
    "lruCapacityPerServer": DEFAULT_CAPACITY,
}


def _prefix_producer(p: Mapping[str, Any]) -> PrefixCacheProducer:
    if not isinstance(p["autoTune"], bool):
        raise ValueError(f"autoTune must be true or false, not {p['autoTune']!r}")
    return PrefixCacheProducer(
        auto_tune=p["autoTune"],
        block_tokens=int(p["blockSizeTokens"]),
        block_chars=int(p["hashBlockSize"] or p["blockSize"]),
        max_blocks=int(p["maxPrefixBlocksToMatch"]),
        max_tokens=int(p["maxPrefixTokensToMatch"]),
        capacity=int(p["lruCapacityPerServer"]),
    )


SCORER_TYPES: PluginTypes[Scorer] = {
    QueueScorer.type_name: ({}, lambda p: QueueScorer()),
    KvCacheScorer.type_name: ({}, lambda p: KvCacheScorer()),
    LoraAffinityScorer.type_name: ({}, lambda p: LoraAffinityScorer()),
    # Its parameters are the index's (PREFIX_PARAMETERS): the producer is made from them.
    PrefixCacheScorer.type_name: (PREFIX_PARAMETERS, lambda p: (_prefix_producer(p), PrefixCacheScorer())[1]),
}
PICKER_TYPES: PluginTypes[Picker] = {
    RandomPicker.type_name: ({}, lambda p: RandomPicker()),
    MaxScorePicker.type_name: ({}, lambda p: MaxScorePicker()),
}
DECISION_TREE = "decision-tree"

# The request plugins the director adds itself: the recent assignments (``picker.countAssignments``),
# and the producers of the data a profile's plugins consume. Their parameters come from ``picker``.
REQUEST_TYPES: PluginTypes[RequestPlugin] = {
    RecentAssignments.type_name: ({"horizon": 2.0}, lambda p: RecentAssignments(float(p["horizon"]))),
    PrefillBacklog.type_name: (
        {"tokensPerSecond": 20_000.0},
        lambda p: PrefillBacklog(float(p["tokensPerSecond"])),
    ),
    RecentTargets.type_name: ({"window": DEFAULT_WINDOW}, lambda p: RecentTargets(float(p["window"]))),
    AdapterSlots.type_name: (
        {"depth": DEFAULT_DEPTH, "horizon": 2.0},
        lambda p: AdapterSlots(int(p["depth"]), float(p["horizon"])),
    ),
    PrefixCacheProducer.type_name: (PREFIX_PARAMETERS, _prefix_producer),
}
# Request plugins a config may declare in ``plugins`` (to set their parameters): made where consumed.
DECLARED_REQUEST_TYPES = (PrefixCacheProducer.type_name,)
PRODUCERS: dict[DataKey[Any], str] = {
    PENDING_PREFILL: PrefillBacklog.type_name,
    PROMPT_TOKENS: PrefillBacklog.type_name,
    RECENT_TARGETS: RecentTargets.type_name,
    RESIDENT: AdapterSlots.type_name,
    UNSEEN_ADAPTERS: AdapterSlots.type_name,
    PREFIX_MATCH: PrefixCacheProducer.type_name,
}


def request_plugin_params(config: PointsmanConfig) -> dict[str, dict[str, Any]]:
    """The parameters of the request plugins the director adds, from the config's ``picker``, and the
    prefix index's from the first ``prefix-cache-scorer`` or ``approx-prefix-cache-producer`` that has
    any (as upstream: one index per picker)."""
    params: dict[str, dict[str, Any]] = {
        RecentAssignments.type_name: {"horizon": config.picker.max_staleness},
        AdapterSlots.type_name: {"horizon": config.picker.max_staleness},
        PrefillBacklog.type_name: {"tokensPerSecond": config.picker.prefill_tokens_per_second},
    }
    for plugin in config.plugins:
        if plugin.type in (PrefixCacheScorer.type_name, PrefixCacheProducer.type_name) and plugin.parameters:
            params[PrefixCacheProducer.type_name] = dict(plugin.parameters)
            break
    return params


def build_request_plugin(kind: str, params: Mapping[str, Mapping[str, Any]], reuse: Reuse) -> RequestPlugin:
    return _make(REQUEST_TYPES, kind, f"<{kind}>", params.get(kind, {}), reuse)


def producer_of(
    key: DataKey[Any], params: Mapping[str, Mapping[str, Any]], reuse: Reuse
) -> RequestPlugin | None:
    """The request plugin that produces ``key`` (``None``: no type does)."""
    kind = PRODUCERS.get(key)
    return None if kind is None else build_request_plugin(kind, params, reuse)


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


def _make(
    types: PluginTypes[T], kind: str, path: str, params: Mapping[str, Any], reuse: Reuse | None = None
) -> T:
    """The plugin of type ``kind``; a request plugin of the same spec in ``reuse`` is kept instead (its
    state outlives the config)."""
    defaults, factory = types[kind]
    values = _params(f"{path}.parameters", params, defaults)
    spec = (kind, json.dumps(values, sort_keys=True, default=repr))
    kept = reuse.get(spec) if reuse else None
    if kept is not None:
        return kept  # type: ignore[return-value]  # a plugin of this type, by its spec
    try:
        plugin = factory(values)
    except ValueError as exc:  # a value the plugin refuses
        raise PluginError(f"{path}.parameters", str(exc)) from None
    if isinstance(plugin, RequestPlugin):
        plugin.spec = spec
    return plugin


def build_plugins(
    specs: Sequence[tuple[str, str, Mapping[str, Any]]], config: SchedulingConfig, reuse: Reuse | None = None
) -> dict[str, Plugin]:
    """``specs`` are ``(name, type, parameters)``, indexed as ``plugins[i]`` in errors. Decision trees
    may refer to any filter declared before or after them. Request plugins of ``reuse`` are kept where
    their spec is built again."""
    filters = filter_types(config)
    plugins: dict[str, Plugin] = {}
    trees: list[tuple[int, str, Mapping[str, Any]]] = []
    for i, (name, kind, params) in enumerate(specs):
        path = f"plugins[{i}]"
        if name in plugins or any(name == t[1] for t in trees):
            raise PluginError(f"{path}.name", f"{name!r} is declared twice")
        if kind in filters:
            plugins[name] = Plugin(name, filter=Node(name, _make(filters, kind, path, params, reuse)))
        elif kind in SCORER_TYPES:
            plugins[name] = Plugin(name, scorer=_make(SCORER_TYPES, kind, path, params, reuse))
        elif kind in PICKER_TYPES:
            plugins[name] = Plugin(name, picker=_make(PICKER_TYPES, kind, path, params, reuse))
        elif kind in DECLARED_REQUEST_TYPES:
            _make(REQUEST_TYPES, kind, path, params)  # checked here, made where consumed
            plugins[name] = Plugin(name)
        elif kind == DECISION_TREE:
            _params(f"{path}.parameters", params, {"tree": None})
            trees.append((i, name, params))
        else:
            known = ", ".join(
                [*filters, *SCORER_TYPES, *PICKER_TYPES, *DECLARED_REQUEST_TYPES, DECISION_TREE]
            )
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
