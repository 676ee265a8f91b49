"""The contenders: the baselines' rules, and Pointsman configs built from the scenario and profiles."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from quality_builders import pod, scenario

from pointsman_quality.contenders import (
    NAMES,
    LeastRequestRouter,
    OraclePrefixRouter,
    RoundRobinRouter,
    ShortestQueueRouter,
    contenders,
    merged,
    models_for,
)
from pointsman_quality.picker_path import DirectorRouter, TwoPickers
from pointsman_quality.scenario import ScenarioError
from pointsman_sim.engine import BLOCK_SIZE, Engine, EngineConfig
from pointsman_sim.fleet import Placement, TraceRequest
from pointsman_sim.prefix import Span, spans_block_hashes

PROFILES = Path(__file__).resolve().parents[3] / "config" / "profiles"
REQUEST = TraceRequest(0.0, 10, 10, "a-0")


def requests(n: int) -> list[TraceRequest]:
    return [TraceRequest(float(i), 10, 10, None) for i in range(n)]


def test_round_robin_takes_each_pod_in_turn() -> None:
    router, pods = RoundRobinRouter(), (pod(), pod(), pod())
    assert [router(r, pods) for r in requests(5)] == [0, 1, 2, 0, 1]


def test_least_request_keeps_the_in_flight_counts_level() -> None:
    pods = (pod(), pod())
    router = LeastRequestRouter(random.Random(1), choices=2)
    counts = [0, 0]
    for r in requests(200):  # none ends: of two drawn pods, the one with fewer in flight
        counts[router(r, pods)] += 1
    assert abs(counts[0] - counts[1]) <= 2


def test_least_request_releases_on_finish() -> None:
    pods = (pod(), pod())
    router = LeastRequestRouter(random.Random(3), choices=2)
    busy = requests(50)
    for r in busy:
        if router(r, pods) == 0:
            router.finished(r)  # pod 0's requests end at once
    assert router._active[0] == 0 < router._active[1]


@pytest.mark.parametrize(
    ("pods", "allowed"),
    [
        ((pod(3), pod(1), pod(1, running=2)), {1}),
        ((pod(0, running=1), pod(0, running=1), pod(2)), {0, 1}),
    ],
)
def test_shortest_queue_takes_the_fewest_waiting_then_running_ties_at_random(pods, allowed) -> None:
    router = ShortestQueueRouter(random.Random(0))
    assert {router(r, pods) for r in requests(40)} == allowed


def test_every_builtin_contender_builds() -> None:
    built = contenders(scenario(), PROFILES)
    assert [c.name for c in built] == list(NAMES)
    by_name = {c.name: c for c in built}
    assert by_name["round-robin"].config is None
    assert by_name["pointsman-423"].config.picker.profile == "default"
    assert by_name["pointsman-423-no-recent"].config.picker.count_assignments is False
    assert by_name["gie-default"].config.picker.count_assignments is False
    assert isinstance(by_name["pointsman-scorer"].router(scenario(), 0), DirectorRouter)


def test_the_models_come_from_the_traffic_with_the_scenario_criticality() -> None:
    s = scenario(
        traffic={
            "baseModel": "m",
            "adapters": [{"prefix": "a", "count": 2, "share": 1}],
            "criticality": "Sheddable",
        }
    )
    assert models_for(s) == [{"modelName": name, "criticality": "Sheddable"} for name in ("m", "a-0", "a-1")]


def test_the_scenario_fragment_lies_under_each_contender_own_settings() -> None:
    s = scenario(
        contenders=["pointsman-423"],
        pointsman={
            "picker": {"maxStaleness": "5s", "profile": "scorer"},
            "scheduling": {"kvCacheThreshold": 0.5},
        },
    )
    (config,) = [c.config for c in contenders(s, PROFILES)]
    assert config.picker.max_staleness == 5.0
    assert config.picker.profile == "default"  # the contender's own setting wins
    assert config.scheduling.kv_cache_threshold == 0.5


def test_extra_contenders_come_from_files_beside_the_scenario_or_inline(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text("picker: {profile: scorer, countAssignments: false}\n")
    s = scenario(
        contenders=["random"],
        extraContenders=[
            {"name": "mine", "config": "mine.yaml"},
            {"name": "inline", "config": {"picker": {"profile": "default"}}},
        ],
    )
    built = {c.name: c.config for c in contenders(s, PROFILES, tmp_path)}
    assert built["mine"].picker.profile == "scorer"
    assert built["inline"].picker.profile == "default"


@pytest.mark.parametrize(
    ("overrides", "path"),
    [
        ({"contenders": ["fastest"]}, "contenders[0]"),
        ({"contenders": ["random", "random"]}, "contenders"),
        ({"extraContenders": [{"name": "x", "config": "missing.yaml"}]}, "extraContenders[0].config"),
        (
            {"extraContenders": [{"name": "x", "config": {"picker": {"profile": "nope"}}}]},
            "extraContenders[0].config",
        ),
        (
            {"extraContenders": [{"name": "x", "config": {"picker": {"listen": "nowhere"}}}]},
            "extraContenders[0].config (x) picker.listen",
        ),
    ],
)
def test_contenders_that_cannot_be_built_name_the_path(overrides, path, tmp_path: Path) -> None:
    with pytest.raises(ScenarioError) as caught:
        contenders(scenario(**{"contenders": ["random"], **overrides}), PROFILES, tmp_path)
    assert any(p.startswith(path) for p, _ in caught.value.problems), caught.value.problems


def test_merged_merges_mappings_and_replaces_the_rest() -> None:
    assert merged({"a": {"b": 1, "c": [1]}, "d": 1}, {"a": {"c": [2]}, "e": 2}) == {
        "a": {"b": 1, "c": [2]},
        "d": 1,
        "e": 2,
    }


def test_a_director_router_sheds_what_the_director_refuses() -> None:
    s = scenario(
        contenders=["pointsman-423"],
        traffic={"adapters": [{"prefix": "a", "count": 1, "share": 1}], "criticality": "Sheddable"},
    )
    router = contenders(s, PROFILES)[0].router(s, 0)
    full = (pod(50, kv=0.99, address="p0"), pod(50, kv=0.99, address="p1"))
    assert router(REQUEST, full) is None
    assert router.errors == {429: 1}
    free = (pod(0, address="p0"), pod(9, address="p1"))
    placement = router(TraceRequest(0.0, 10, 10, "a-0"), free)
    assert placement == Placement(0, "a-0")


def test_two_picker_contenders_name_their_config_and_whether_they_share() -> None:
    named = [
        "gie-default",
        "gie-default-2-pickers-shared",
        "gie-default-2-pickers",
        "pointsman-best-2-pickers",
    ]
    by_name = {c.name: c for c in contenders(scenario(contenders=[*named, "prefix-only"]), PROFILES)}
    assert not {"gie-default-2-pickers", "gie-default-2-pickers-shared"} & set(NAMES)  # named, not default
    shared, alone = by_name["gie-default-2-pickers-shared"], by_name["gie-default-2-pickers"]
    assert (shared.pickers, shared.shared, alone.pickers, alone.shared) == (2, True, 2, False)
    assert shared.config == by_name["gie-default"].config
    assert isinstance(shared.router(scenario(), 0), TwoPickers)
    assert by_name["pointsman-best-2-pickers"].config.picker.profile == "best"
    assert by_name["prefix-only"].config.picker.profile == "prefix-only"


def test_the_oracle_sends_a_request_where_its_prefix_is_cached_unless_that_pod_is_far_busier() -> None:
    engines = [Engine(EngineConfig()) for _ in range(3)]
    system = Span(1, 512)
    request = TraceRequest(0.0, 544, 4, None, (system, Span(2, 32)))
    # Pod 2 served the system prompt before.
    engines[2].submit("warm", 512, 1, None, 0.0, spans_block_hashes((system,), None, BLOCK_SIZE))
    while engines[2].has_work:
        engines[2].step(0.0)
    oracle = OraclePrefixRouter()
    oracle.attach(engines)
    assert oracle(request, [None] * 3) == 2  # type: ignore[list-item]
    for i in range(10):  # pod 2 now far busier than the others
        engines[2].submit(f"busy{i}", 100, 100, None, 0.0)
    assert oracle(request, [None] * 3) == 0  # type: ignore[list-item]
    with pytest.raises(RuntimeError, match="on_start"):
        OraclePrefixRouter()(request, [None] * 3)  # type: ignore[list-item]
