"""The scheduling behaviour of the `best` profile (config/profiles/best.yaml): which profiles read the
prefill backlog, the backlog and target count the director keeps for them, and the config errors of
its filters. The least-work and LoRA spread-affinity filters' own tables are in test_picker_filters.py."""

from __future__ import annotations

import itertools
import random
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from picker_builders import NOW, config, pod, snapshot
from prometheus_client import CollectorRegistry

from pointsman_picker.assignments import PrefillBacklog, RecentTargets
from pointsman_picker.director import Director
from pointsman_picker.metrics import PickerMetrics
from pointsman_picker.scheduling import Node
from pointsman_picker.scheduling.filters import LeastKvCache, LeastWork
from pointsman_picker.scheduling.plugins import PluginError
from pointsman_picker.scheduling.profiles import build_profile
from pointsman_picker.scheduling.tree import reads_pending_prefill
from pointsman_picker.snapshots import StaticSnapshotSource
from pointsman_shared.config import parse_config
from pointsman_shared.snapshot import PodSnapshot

PROFILES = Path(__file__).resolve().parents[3] / "config" / "profiles"


# -- which profiles need the backlog ---------------------------------------------------------------
def test_only_trees_with_a_least_work_filter_read_the_pending_prefill():
    work = Node("work", LeastWork(0.0345, 0.04, 20.0, 7.0, 3.5))
    kv = Node("kv", LeastKvCache())
    assert reads_pending_prefill(Node("root", LeastKvCache(), on_failure=work))
    assert not reads_pending_prefill(Node("root", LeastKvCache(), on_success=kv))
    assert not reads_pending_prefill(None)


def best_doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((PROFILES / "best.yaml").read_text(encoding="utf-8"))
    return doc


@pytest.mark.parametrize("name", ["best"])
def test_the_shipped_profiles_build_and_ask_for_the_backlog(name):
    doc = yaml.safe_load((PROFILES / f"{name}.yaml").read_text(encoding="utf-8"))
    profile = build_profile(parse_config(doc))
    assert profile.name == name
    assert profile.uses_pending_prefill
    assert not build_profile(parse_config({})).uses_pending_prefill  # the #423 tree does not


# -- the prefill backlog ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "records", "at", "expected"),
    [
        ("nothing recorded", [], 0.0, {}),
        ("drains at the rate", [("a", 1000, 0.0)], 0.02, {"a": 800.0}),
        ("adds up", [("a", 1000, 0.0), ("a", 500, 0.01)], 0.01, {"a": 1400.0}),
        ("never below zero, and then forgotten", [("a", 100, 0.0), ("a", 100, 1.0)], 1.05, {}),
        ("an unknown prompt adds nothing", [("a", 0, 0.0)], 0.0, {}),
        ("per pod", [("a", 1000, 0.0), ("b", 300, 0.01)], 0.01, {"a": 900.0, "b": 300.0}),
    ],
)
def test_prefill_backlog(name, records, at, expected):
    backlog = PrefillBacklog(10_000.0)
    for address, tokens, now in records:
        backlog.record(address, tokens, now)
    assert backlog.pending(at) == pytest.approx(expected), name


def test_recent_targets_count_the_distinct_targets_within_the_window():
    targets = RecentTargets(10.0)
    assert [targets.seen(t, at) for t, at in [("a", 0.0), ("a", 1.0), ("b", 2.0), (None, 3.0)]] == [
        1,
        1,
        2,
        3,
    ]
    # "a" (1.0) and "b" (2.0) are older than the window at 12.5: the others and "c" are left.
    assert targets.seen("c", 12.5) == 2
    assert targets.seen("c", 20.0) == 1
    with pytest.raises(ValueError, match="positive"):
        RecentTargets(0)


def test_prefill_backlog_needs_a_positive_rate():
    with pytest.raises(ValueError, match="positive"):
        PrefillBacklog(0)


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
    first = d.route(body(4 * 2000)).endpoint  # 2000 tokens: ~69 ms of prefill
    other = "b" if first == "a" else "a"
    now[0] += 0.001
    second = d.route(body(40)).endpoint  # one waiting request each now (7 ms), but 69 ms pending on `first`
    assert second == other
    now[0] += 0.001
    assert d.route(body(40)).endpoint == other
    # 20k tokens/s drain the 2000 in 0.1 s; then the waiting counts decide again (two on `other`).
    now[0] += 0.2
    assert d.route(body(40)).endpoint == first


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
    assert d.route(body(4000)).endpoint == "a"
    assert d._backlog is None
    assert d._targets is None


def test_the_best_profile_is_told_how_many_adapters_compete(monkeypatch):
    pods = (pod(address="a"), pod(address="b"))
    now = [NOW]
    d = best_director(pods, lambda: now[0])
    seen = []
    schedule = d._scheduler.schedule
    monkeypatch.setattr(
        d._scheduler, "schedule", lambda req, *a: seen.append(req.recent_targets) or schedule(req, *a)
    )
    for _ in range(3):
        now[0] += 0.01
        d.route(body(40))
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
    ],
)
def test_mistakes_name_their_path(plugin, path, message):
    with pytest.raises(PluginError) as raised:
        build_profile(parse_config({"plugins": [plugin]}))
    assert raised.value.path == path
    assert message in raised.value.message
