"""Profiles: the #423 tree written as plugins picks exactly as the built-in one; the scorer profile;
scores clamped and weighted; every config mistake names its path."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from picker_builders import Steps, pod, run_profile, tree_profile

from pointsman_picker.scheduling import CycleState, Drop, SchedulingRequest
from pointsman_picker.scheduling.assignments import POSITIONS
from pointsman_picker.scheduling.indexed import indexed
from pointsman_picker.scheduling.pickers import MaxScorePicker
from pointsman_picker.scheduling.profiles import Profile, build_profile
from pointsman_picker.scheduling.registry import PluginError
from pointsman_shared.config import PointsmanConfig, parse_config

PROFILES = Path(__file__).resolve().parents[3] / "config" / "profiles"


def config_with(doc: dict[str, Any], profile: str) -> PointsmanConfig:
    return parse_config({**doc, "picker": {"profile": profile}})


def shipped(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((PROFILES / name).read_text(encoding="utf-8"))
    return doc


POD_SETS = [
    (
        pod(0, 0.2, 2, {"foo", "bar"}, address="a"),
        pod(3, 0.1, 2, {"foo", "x"}, address="b"),
        pod(10, 0.2, 2, {"foo"}, address="c"),
    ),
    (pod(10, 0.9, 2, address="a"), pod(3, 0.85, 2, address="b"), pod(10, 0.85, 2, address="c")),
    (pod(6, 0.2, address="a"), pod(0, 0.85, address="b"), pod(4, 0.8, address="c")),
    (pod(300, 0.1, 2, {"x"}, address="a"), pod(128, 0.5, 2, address="b")),
    (pod(0, 0.5, address="a"), pod(1, 0.1, address="b"), pod(9, 0.0, address="c"), pod(1, 0.1, address="d")),
]
REQUESTS = [SchedulingRequest("x", critical=True), SchedulingRequest("x", critical=False)]


def outcome(result: Any) -> str:
    return "dropped" if isinstance(result, Drop) else result.address


@pytest.mark.parametrize("pods", POD_SETS)
@pytest.mark.parametrize("request_", REQUESTS)
def test_the_shipped_423_tree_picks_as_the_built_in_one(pods, request_):
    profile = build_profile(config_with(shipped("tree-423.yaml"), "tree-423"))
    written, built_in = random.Random(0), random.Random(0)
    for _ in range(200):  # same seed, same draws: the same pods, in the same order
        assert outcome(run_profile(profile, request_, pods, written)) == outcome(
            run_profile(tree_profile(), request_, pods, built_in)
        )


def test_the_tree_reports_the_same_steps_by_the_plugin_names():
    trace = Steps()
    profile = build_profile(config_with(shipped("tree-423.yaml"), "tree-423"))
    run_profile(profile, REQUESTS[0], POD_SETS[0], random.Random(0), trace)
    assert [name for name, _ in trace.filters] == [
        "critical request",
        "low queueing",
        "LoRA soft affinity",
        "least queuing",
        "least KV cache",
    ]


@pytest.mark.parametrize(("doc", "profile"), [({}, "scorer"), (shipped("scorer.yaml"), "scorer-weighted")])
def test_the_scorer_profile_prefers_the_adapter_and_the_short_queue(doc, profile):
    built = build_profile(config_with(doc, profile))
    pods = (
        pod(0, 0.1, 2, address="idle-no-adapter"),  # 1 + 0.9 + 0.8 (free slot)
        pod(1, 0.1, 2, {"x"}, address="adapter"),  # 0.9 + 0.9 + 1.0
        pod(10, 0.9, 1, {"y"}, address="busy"),  # 0 + 0.1 + 0
    )
    assert run_profile(built, REQUESTS[0], pods, random.Random(0)).address == "adapter"


# A sheddable request for adapter "x" through best's sheddable branch: among the pods with capacity
# (at most 5 waiting, KV cache at most 0.8), those with its adapter or a free slot; dropped when there
# are none (a pod whose slots other adapters hold would make it, and the Critical ones behind it, wait).
SHEDDABLE = [
    ((pod(0, 0.1, 2, {"y", "z"}, address="idle-full"), pod(3, 0.1, 2, {"x"}, address="adapter")), "adapter"),
    ((pod(0, 0.1, 2, {"y", "z"}, address="idle-full"), pod(3, 0.1, 2, {"y"}, address="slot")), "slot"),
    ((pod(0, 0.1, 2, {"y", "z"}, address="idle-full"), pod(9, 0.1, 2, {"x"}, address="queued")), "dropped"),
    ((pod(6, 0.1, 2, {"x"}, address="a"), pod(0, 0.9, 2, {"x"}, address="b")), "dropped"),
]


@pytest.mark.parametrize(("pods", "chosen"), SHEDDABLE)
def test_best_sends_sheddable_requests_where_their_adapter_is_or_drops_them(pods, chosen):
    profile = build_profile(parse_config(shipped("best.yaml")))
    request = SchedulingRequest("x", False, {"model": "x", "prompt": "hello"})
    for seed in range(20):
        state = CycleState()
        state[POSITIONS] = {p.address: i for i, p in enumerate(pods)}
        prepared = profile.lifecycle.prepare(request, indexed(pods), state, 0.0)
        assert outcome(profile.schedule(request, prepared, state, random.Random(seed))) == chosen


def test_scores_are_clamped_and_weighted():
    loud = ("loud", 1.0, lambda request, pods, state: [5.0, -3.0])  # clamped to 1 and 0
    quiet = ("quiet", 0.5, lambda request, pods, state: [0.0, 1.0])
    profile = Profile("p", (), (loud, quiet), MaxScorePicker())
    pods = (pod(address="a"), pod(address="b"))
    assert run_profile(profile, REQUESTS[0], pods, random.Random(0)).address == "a"  # 1.0 beats 0.5


def test_a_filter_that_keeps_nothing_drops_the_request():
    doc = {
        "plugins": [{"type": "low-queue-filter", "parameters": {"threshold": 1}}],
        "profiles": [{"name": "strict", "plugins": [{"pluginRef": "low-queue-filter"}]}],
    }
    result = run_profile(build_profile(config_with(doc, "strict")), REQUESTS[0], (pod(5),), random.Random(0))
    assert result == Drop("no pod left after low-queue-filter")


def profile_of(*refs: str) -> list[dict[str, Any]]:
    return [{"name": "p", "plugins": [{"pluginRef": r} for r in refs]}]


@pytest.mark.parametrize(
    ("doc", "path", "message"),
    [
        ({"plugins": [{"type": "magic"}]}, "plugins[0].type", "unknown plugin type"),
        ({"plugins": [{"type": "queue-scorer"}, {"type": "queue-scorer"}]}, "plugins[1].name", "twice"),
        (
            {"plugins": [{"type": "low-queue-filter", "parameters": {"treshold": 1}}]},
            "plugins[0].parameters.treshold",
            "unknown parameter",
        ),
        (
            {"plugins": [{"type": "low-queue-filter", "parameters": {"threshold": -1}}]},
            "plugins[0].parameters.threshold",
            "negative",
        ),
        (
            {"plugins": [{"type": "decision-tree", "parameters": {"tree": {"filter": "nope"}}}]},
            "plugins[0].parameters.tree.filter",
            "not a declared filter",
        ),
        ({"profiles": profile_of("nope")}, "profiles[0].plugins[0].pluginRef", "no plugin named"),
        (
            {
                "plugins": [{"type": "queue-scorer"}, {"type": "least-queue-filter"}],
                "profiles": profile_of("queue-scorer", "least-queue-filter"),
            },
            "profiles[0].plugins[1].pluginRef",
            "filters come before",
        ),
        ({}, "picker.profile", "no profile 'p'"),
    ],
)
def test_mistakes_name_their_path(doc, path, message):
    with pytest.raises(PluginError) as raised:
        build_profile(config_with(doc, "p"))
    assert raised.value.path == path
    assert message in raised.value.message
