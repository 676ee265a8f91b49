"""One run's figures: the latency percentiles, and repeats pooled."""

from __future__ import annotations

from pathlib import Path

import pytest
from quality_builders import scenario

from pointsman_quality.contenders import contenders
from pointsman_quality.runs import latency_figures, prefix_hit_rate, run, stats
from pointsman_quality.scenario import engine_configs
from pointsman_quality.sweep import passes
from pointsman_sim.engine import FinishedRequest, Totals
from pointsman_sim.fleet import FleetResult, Served

PROFILES = Path(__file__).resolve().parents[3] / "config" / "profiles"


def test_latency_figures_take_the_shared_rule_and_are_zero_without_requests() -> None:
    ttft = [float(i) for i in range(1, 101)]
    figures = latency_figures(reversed(ttft), [0.5, 0.1], iter([3.0]))
    assert figures == {
        "ttft_p50_s": 50.0,
        "ttft_p90_s": 90.0,
        "ttft_p99_s": 99.0,
        "tpot_p90_s": 0.5,
        "e2e_p90_s": 3.0,
    }
    assert set(latency_figures([], [], []).values()) == {0.0}


def test_repeats_pool_other_samples_of_the_same_traffic() -> None:
    s = scenario(contenders=["round-robin", "pointsman-423"])
    by_name = {c.name: c for c in contenders(s, PROFILES)}
    engines = engine_configs(s)
    one = run(s, by_name["round-robin"], engines, 20.0, 3.0)
    again = run(s, by_name["round-robin"], engines, 20.0, 3.0)
    pooled = run(s, by_name["round-robin"], engines, 20.0, 3.0, repeats=3)
    assert one == again  # the same seed, the same figures
    assert pooled != one
    assert pooled.requests == pytest.approx(one.requests, rel=0.5)  # counts are per repeat
    assert pooled.finished + pooled.rejected == pooled.requests
    director = run(s, by_name["pointsman-423"], engines, 20.0, 3.0, repeats=2)
    assert director.finished == director.requests


def fleet_result(served: int, rejected: int) -> FleetResult:
    done = tuple(Served(0, FinishedRequest(f"r{i}", 10, 5, 0.0, 0.1, 0.5)) for i in range(served))
    return FleetResult(done, rejected=rejected, shed=0, totals=(), ended_at=1.0)


def test_a_request_refused_in_one_of_two_repeats_is_not_rounded_away() -> None:
    # 9 requests over two repeats, one refused: per repeat 4.5 requests and 4 finished, both round to 4.
    pooled = stats(10.0, 9, [fleet_result(4, 0), fleet_result(4, 1)], pods=1)
    assert (pooled.requests, pooled.finished, pooled.rejected) == (4, 4, 0)
    assert pooled.unserved == 1
    assert not passes(pooled, 2.0)


def test_the_prefix_hit_rate_is_every_pods_hits_over_its_queries() -> None:
    s = scenario(
        contenders=["round-robin", "oracle-prefix"],
        traffic={
            "baseShare": 1,
            "prompts": {
                "kind": "shared-prefix",
                "numGroups": 2,
                "systemPromptLen": 512,
                "questionLen": 32,
                "outputLen": 4,
            },
        },
    )
    by_name = {c.name: c for c in contenders(s, PROFILES)}
    engines = engine_configs(s)
    spread, bound = (run(s, by_name[name], engines, 20.0, 3.0) for name in ("round-robin", "oracle-prefix"))
    # Two system prompts, each requested again and again: most of every prompt is a hit.
    assert 0.5 < spread.prefix_hit_rate <= bound.prefix_hit_rate < 1.0
    totals = (Totals(0, 0, 0, 0, 0, prefix_cache_queries=100, prefix_cache_hits=30), Totals(0, 0, 0, 0, 0))
    assert prefix_hit_rate(totals) == 0.3
    assert prefix_hit_rate(()) == 0.0
