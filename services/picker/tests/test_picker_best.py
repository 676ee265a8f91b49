"""The scheduling behaviour of the `best` profile (config/profiles/best.yaml): which request plugins a
profile gets for what its filters consume (the prefill backlog, the target count), what they change in
the director's decisions, and the config errors of its filters. The least-work and LoRA spread-affinity
filters' own tables are in test_picker_filters.py."""

from __future__ import annotations

import itertools
import random
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from picker_builders import NOW, config, ctx, pod, snapshot
from prometheus_client import CollectorRegistry

from pointsman_picker.director import Director
from pointsman_picker.metrics import PickerMetrics
from pointsman_picker.scheduling.profiles import Profile, build_profile
from pointsman_picker.scheduling.recent_targets import RECENT_TARGETS
from pointsman_picker.scheduling.registry import PluginError
from pointsman_picker.snapshots import StaticSnapshotSource
from pointsman_shared.config import parse_config
from pointsman_shared.snapshot import PodSnapshot

PROFILES = Path(__file__).resolve().parents[3] / "config" / "profiles"


# -- what the profiles' plugins consume, and who produces it ----------------------------------------
def best_doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((PROFILES / "best.yaml").read_text(encoding="utf-8"))
    return doc


def lifecycle_types(profile: Profile) -> list[str]:
    return [plugin.type_name for plugin in profile.lifecycle.plugins]


@pytest.mark.parametrize(
    ("name", "doc", "expected"),
    [
        ("the #423 tree", {}, ["recent-assignments"]),
        ("no assignments counted", {"picker": {"countAssignments": False}}, []),
        (
            "best",
            "best",
            [
                "recent-assignments",
                "prefill-backlog",
                "recent-targets",
                "adapter-slots",
                "approx-prefix-cache-producer",
            ],
        ),
        (
            "least work alone",
            {
                "plugins": [{"name": "w", "type": "least-work-filter"}],
                "profiles": [{"name": "p", "plugins": [{"pluginRef": "w"}]}],
                "picker": {"profile": "p", "countAssignments": False},
            },
            ["prefill-backlog"],
        ),
        (
            # Was a bug: the spread filter alone never got its target count, so maxAdapterShare never held.
            "the spread filter alone",
            {
                "plugins": [{"name": "s", "type": "lora-spread-affinity-filter"}],
                "profiles": [{"name": "p", "plugins": [{"pluginRef": "s"}]}],
                "picker": {"profile": "p", "countAssignments": False},
            },
            ["recent-targets", "adapter-slots"],
        ),
    ],
)
def test_a_profile_gets_the_producers_of_what_its_plugins_consume(name, doc, expected):
    profile = build_profile(parse_config(best_doc() if doc == "best" else doc))
    assert sorted(lifecycle_types(profile)) == sorted(expected), name


# -- the director ------------------------------------------------------------------------------------
def body(chars: int) -> bytes:
    return b'{"model":"my-model","prompt":"' + b"x" * chars + b'"}'


def best_director(pods: tuple[PodSnapshot, ...], clock: Any, **picker: Any) -> Director:
    doc = best_doc()
    doc["picker"] = {**doc["picker"], **picker}
    return Director(
        config(**doc),
        StaticSnapshotSource(snapshot(*pods)),
        PickerMetrics(CollectorRegistry()),
        rng=random.Random(1),
        clock=clock,
        timer=time.perf_counter,
    )


def test_a_long_prompt_keeps_the_next_requests_off_its_pod_until_it_drains():
    pods = (pod(address="a"), pod(address="b"))
    now = [NOW]
    d = best_director(pods, lambda: now[0])
    first = d.route(ctx(body(4 * 2000))).endpoint  # 2000 tokens: ~69 ms of prefill
    other = "b" if first == "a" else "a"
    now[0] += 0.001
    second = d.route(
        ctx(body(40))
    ).endpoint  # one waiting request each now (7 ms), but 69 ms pending on `first`
    assert second == other
    now[0] += 0.001
    assert d.route(ctx(body(40))).endpoint == other
    # 20k tokens/s drain the 2000 in 0.1 s; then the waiting counts decide again (two on `other`).
    now[0] += 0.2
    assert d.route(ctx(body(40))).endpoint == first


def test_the_default_profile_keeps_no_backlog():
    ticks = itertools.count(1)
    d = Director(
        config(),
        StaticSnapshotSource(snapshot(pod(address="a"))),
        PickerMetrics(CollectorRegistry()),
        rng=random.Random(1),
        clock=lambda: NOW + next(ticks) / 1000,
        timer=time.perf_counter,
    )
    assert d.route(ctx(body(4000))).endpoint == "a"
    assert lifecycle_types(d._profile) == ["recent-assignments"]


def spread_director(share: float) -> Director:
    """The spread filter alone (and no assignments), with ``maxAdapterShare`` at ``share``."""
    params = {"spreadRatio": 0.0, "spreadMargin": 0.0, "maxAdapterShare": share, "threshold": 1.0}
    doc = {
        "plugins": [{"name": "spread", "type": "lora-spread-affinity-filter", "parameters": params}],
        "profiles": [{"name": "spread", "plugins": [{"pluginRef": "spread"}]}],
        "picker": {"profile": "spread", "countAssignments": False},
        "models": [{"modelName": f"m{i}", "criticality": "Critical"} for i in range(3)],
    }
    # "a" runs m0 and is far busier than the mean; "b" has a free slot: the filter would spread m0 there.
    pods = (pod(3, address="a", adapters=["m0"], max_lora=2), pod(0, address="b", max_lora=2))
    return Director(
        config(**doc),
        StaticSnapshotSource(snapshot(*pods)),
        PickerMetrics(CollectorRegistry()),
        rng=random.Random(1),
        clock=lambda: NOW,
        timer=time.perf_counter,
    )


def m0() -> bytes:
    return b'{"model":"m0","prompt":"x"}'


def test_the_spread_filter_alone_holds_its_max_adapter_share():
    # Three models routed lately want 3 slots; the pods have 4. Under a share of 0.5 (2 slots) the
    # slots are wanted by adapters without one: m0 stays on "a". Before the lifecycle, the spread
    # filter alone was never told the count (it stayed 0) and always spread.
    d = spread_director(share=0.5)
    d.route(ctx(b'{"model":"m1"}'))
    d.route(ctx(b'{"model":"m2"}'))
    assert d.route(ctx(m0())).endpoint == "a"
    # With a share that the three fit under, it spreads.
    d = spread_director(share=1.0)
    d.route(ctx(b'{"model":"m1"}'))
    d.route(ctx(b'{"model":"m2"}'))
    assert d.route(ctx(m0())).endpoint == "b"


def test_the_best_profile_is_told_how_many_adapters_compete():
    pods = (pod(address="a"), pod(address="b"))
    now = [NOW]
    d = best_director(pods, lambda: now[0])
    seen = []
    for _ in range(3):
        now[0] += 0.01
        resolved = d.resolve(ctx(body(40)))
        seen.append(d.schedule(resolved, d.candidates(resolved)).state[RECENT_TARGETS])
    assert seen == [1, 1, 1]  # one model, however often


@pytest.mark.parametrize(
    ("plugin", "path", "message"),
    [
        (
            {"type": "least-work-filter", "parameters": {"perToken": 1}},
            "plugins[0].parameters.perToken",
            "unknown parameter",
        ),
        (
            {"type": "least-work-filter", "parameters": {"tolerance": -1}},
            "plugins[0].parameters.tolerance",
            "negative",
        ),
        (
            {"type": "lora-spread-affinity-filter", "parameters": {"spreadRatio": "high"}},
            "plugins[0].parameters.spreadRatio",
            "a number",
        ),
        (
            {"type": "lora-spread-affinity-filter", "parameters": {"spreadMargin": -2}},
            "plugins[0].parameters.spreadMargin",
            "negative",
        ),
        (
            {"type": "lora-spread-affinity-filter", "parameters": {"heldSpreadRatio": "high"}},
            "plugins[0].parameters",
            "heldSpreadRatio must be a non-negative number",
        ),
        (
            {"type": "lora-spread-affinity-filter", "parameters": {"heldSpreadRatio": -0.5}},
            "plugins[0].parameters",
            "heldSpreadRatio must be a non-negative number",
        ),
        (
            {"type": "lora-spread-affinity-filter", "parameters": {"heldSpreadMargin": -1}},
            "plugins[0].parameters.heldSpreadMargin",
            "negative",
        ),
    ],
)
def test_mistakes_name_their_path(plugin, path, message):
    with pytest.raises(PluginError) as raised:
        build_profile(parse_config({"plugins": [plugin]}))
    assert raised.value.path == path
    assert message in raised.value.message
