"""The plugin registry: every type by its name builds its plugin with the config's defaults; decision
trees wire filters by name; every mistake names its path."""

from __future__ import annotations

from typing import Any

import pytest

from pointsman_picker.scheduling import Node
from pointsman_picker.scheduling.filters import (
    CriticalRequest,
    HasCapacity,
    LeastKvCache,
    LeastQueuing,
    LeastWork,
    LoraSoftAffinity,
    LoraSpreadAffinity,
    LowQueueing,
)
from pointsman_picker.scheduling.pickers import MaxScorePicker, RandomPicker
from pointsman_picker.scheduling.registry import (
    DEFAULT_PER_KV_CACHE,
    DEFAULT_PER_PENDING_TOKEN,
    DEFAULT_PER_RUNNING,
    DEFAULT_WORK_TOLERANCE,
    PICKER_TYPES,
    SCORER_TYPES,
    Plugin,
    PluginError,
    build_plugins,
    filter_types,
)
from pointsman_picker.scheduling.scorers import KvCacheScorer, LoraAffinityScorer, QueueScorer
from pointsman_picker.scheduling.tree import DROP_SHEDDABLE
from pointsman_shared.config import SchedulingConfig

CONFIG = SchedulingConfig(
    queueing_threshold_lora=50,
    queue_threshold_critical=3,
    kv_cache_threshold=0.7,
    lora_affinity_threshold=0.9,
)


def built(kind: str, parameters: dict[str, Any] | None = None) -> Plugin:
    return build_plugins([("p", kind, parameters or {})], CONFIG)["p"]


@pytest.mark.parametrize(
    ("kind", "parameters", "expected"),
    [
        ("critical-request-filter", {}, Plugin("p", filter=Node("p", CriticalRequest()))),
        ("low-queue-filter", {}, Plugin("p", filter=Node("p", LowQueueing(50)))),
        ("low-queue-filter", {"threshold": 7}, Plugin("p", filter=Node("p", LowQueueing(7)))),
        ("has-capacity-filter", {}, Plugin("p", filter=Node("p", HasCapacity(3, 0.7)))),
        (
            "has-capacity-filter",
            {"queueThreshold": 1, "kvCacheThreshold": 1},
            Plugin("p", filter=Node("p", HasCapacity(1, 1.0))),
        ),
        ("least-queue-filter", {}, Plugin("p", filter=Node("p", LeastQueuing()))),
        ("least-kv-cache-filter", {}, Plugin("p", filter=Node("p", LeastKvCache()))),
        ("lora-affinity-filter", {}, Plugin("p", filter=Node("p", LoraSoftAffinity(0.9)))),
        (
            "lora-spread-affinity-filter",
            {"spreadMargin": 2},
            Plugin("p", filter=Node("p", LoraSpreadAffinity(0.9, 0.1, 2.0, 0.75))),
        ),
        (
            "least-work-filter",
            {"perWaiting": 7},
            Plugin(
                "p",
                filter=Node(
                    "p",
                    LeastWork(
                        DEFAULT_PER_PENDING_TOKEN,
                        DEFAULT_PER_RUNNING,
                        DEFAULT_PER_KV_CACHE,
                        7.0,
                        DEFAULT_WORK_TOLERANCE,
                    ),
                ),
            ),
        ),
        ("queue-scorer", {}, Plugin("p", scorer=QueueScorer())),
        ("kv-cache-scorer", {}, Plugin("p", scorer=KvCacheScorer())),
        ("lora-affinity-scorer", {}, Plugin("p", scorer=LoraAffinityScorer())),
        ("random-picker", {}, Plugin("p", picker=RandomPicker())),
        ("max-score-picker", {}, Plugin("p", picker=MaxScorePicker())),
    ],
)
def test_each_type_builds_its_plugin_with_the_config_defaults(kind, parameters, expected):
    assert built(kind, parameters) == expected


@pytest.mark.parametrize("kind", [*filter_types(CONFIG), *SCORER_TYPES, *PICKER_TYPES])
def test_every_registered_type_is_the_type_name_of_what_it_builds(kind):
    plugin = built(kind)
    made = plugin.filter.filter if plugin.filter is not None else plugin.scorer or plugin.picker
    assert made.type_name == kind


def test_a_decision_tree_wires_the_filters_by_name():
    specs = [
        ("critical", "critical-request-filter", {}),
        (
            "tree",
            "decision-tree",
            {
                "tree": {
                    "filter": "critical",
                    "onSuccess": {"filter": "least", "onSuccessOrFailure": {"filter": "kv"}},
                    "onFailure": "drop",
                }
            },
        ),
        ("least", "least-queue-filter", {}),  # declared after the tree that uses it
        ("kv", "least-kv-cache-filter", {}),
    ]
    kv = Node("kv", LeastKvCache())
    expected = Node(
        "critical",
        CriticalRequest(),
        on_success=Node("least", LeastQueuing(), on_success=kv, on_failure=kv),
        on_failure=DROP_SHEDDABLE,
    )
    assert build_plugins(specs, CONFIG)["tree"] == Plugin("tree", filter=expected)


def test_an_unknown_type_lists_the_known_ones_in_order():
    with pytest.raises(PluginError) as raised:
        built("magic")
    assert raised.value.path == "plugins[0].type"
    assert raised.value.message == (
        "unknown plugin type 'magic' (known: critical-request-filter, low-queue-filter, "
        "has-capacity-filter, least-queue-filter, least-kv-cache-filter, least-work-filter, "
        "least-work-prefix-filter, lora-spread-affinity-filter, lora-affinity-filter, "
        "prefix-cache-affinity-filter, queue-scorer, kv-cache-scorer, lora-affinity-scorer, "
        "prefix-cache-scorer, random-picker, max-score-picker, approx-prefix-cache-producer, decision-tree)"
    )


def tree(spec: Any) -> list[tuple[str, str, dict[str, Any]]]:
    return [("f", "least-queue-filter", {}), ("t", "decision-tree", {"tree": spec})]


@pytest.mark.parametrize(
    ("specs", "path", "message"),
    [
        (
            [("a", "queue-scorer", {}), ("a", "least-queue-filter", {})],
            "plugins[1].name",
            "'a' is declared twice",
        ),
        (
            [("t", "decision-tree", {"tree": None}), ("t", "queue-scorer", {})],
            "plugins[1].name",
            "'t' is declared twice",
        ),
        ([("s", "queue-scorer", {"weight": 2})], "plugins[0].parameters.weight", "(known: none)"),
        (
            [("f", "low-queue-filter", {"threshold": True})],
            "plugins[0].parameters.threshold",
            "must be a number, not True",
        ),
        ([("t", "decision-tree", {"root": {}})], "plugins[0].parameters.root", "(known: tree)"),
        (tree("drop"), "plugins[1].parameters.tree", "must start with a filter"),
        (tree(None), "plugins[1].parameters.tree", "must start with a filter"),
        (tree(["f"]), "plugins[1].parameters.tree", "must be a mapping with `filter`, or `drop`"),
        (tree({"filter": "f", "then": {}}), "plugins[1].parameters.tree.then", "unknown key"),
        (
            tree({"filter": "f", "onSuccess": {"filter": "nope"}}),
            "plugins[1].parameters.tree.onSuccess.filter",
            "'nope' is not a declared filter plugin",
        ),
        (
            [("s", "queue-scorer", {}), ("t", "decision-tree", {"tree": {"filter": "s"}})],
            "plugins[1].parameters.tree.filter",
            "'s' is not a declared filter plugin",
        ),
        (
            tree({"filter": "f", "onSuccess": "drop", "onSuccessOrFailure": "drop"}),
            "plugins[1].parameters.tree.onSuccessOrFailure",
            "use it alone",
        ),
    ],
)
def test_mistakes_name_their_path(specs, path, message):
    with pytest.raises(PluginError) as raised:
        build_plugins(specs, CONFIG)
    assert raised.value.path == path
    assert message in raised.value.message
