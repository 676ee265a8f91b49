"""The capacity search and a whole sweep over a tiny scenario."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from quality_builders import scenario, stats

from pointsman_quality.contenders import contenders
from pointsman_quality.scenario import engine_configs
from pointsman_quality.sweep import (
    Capacity,
    CapacityMethod,
    Sweep,
    VariantResult,
    contradictions,
    find_capacity,
    passes,
)

PROFILES = Path(__file__).resolve().parents[3] / "config" / "profiles"


def knee(at: float):
    """A contender whose p99 TTFT jumps past the bound above ``at`` req/s; the rates it was asked."""
    asked: list[float] = []

    def probe(rate: float):
        asked.append(rate)
        return stats(rate=rate, ttft_p99_s=0.5 if rate <= at else 30.0)

    return probe, asked


@pytest.mark.parametrize(("at", "start"), [(100.0, 10.0), (3.0, 10.0), (10.0, 10.0), (0.7, 10.0)])
def test_capacity_is_found_within_the_precision(at: float, start: float) -> None:
    probe, asked = knee(at)
    found = find_capacity(probe, start, bound=2.0, precision=0.05)
    assert at * 0.95 <= found.rate <= at
    assert not found.lower_bound_only
    assert [p.rate for p in found.probes] == asked
    assert len(asked) < 20


def test_a_contender_that_never_fails_is_reported_as_at_least_its_last_rate() -> None:
    probe, asked = knee(float("inf"))
    found = find_capacity(probe, 1.0, bound=2.0, precision=0.05)
    assert found.lower_bound_only
    assert found.rate == asked[-1] == 2.0 ** (len(asked) - 1)


def test_a_contender_that_always_fails_has_no_capacity() -> None:
    probe, _ = knee(-1.0)
    assert find_capacity(probe, 1.0, bound=2.0, precision=0.05).rate == 0.0


@pytest.mark.parametrize(
    ("values", "ok"),
    [
        ({}, True),
        ({"ttft_p99_s": 2.0}, False),
        ({"unserved": 1}, False),  # a shed or refused request is load not served
    ],
)
def test_a_rate_passes_only_when_every_request_was_served_in_time(values, ok) -> None:
    assert passes(stats(**values), 2.0) is ok


def test_a_sweep_finds_capacities_and_runs_every_contender_at_every_level() -> None:
    s = scenario(contenders=["pointsman-423", "round-robin"])
    built = contenders(s, PROFILES)
    with ThreadPoolExecutor(2) as pool:
        sweep = Sweep(s, built, pool, levels=(0.5, 1.0), duration=2.0)
        result = sweep.variant(engine_configs(s), None)
    assert set(result.capacity) == {"pointsman-423", "round-robin"}
    assert result.capacity["pointsman-423"].rate > 0
    reference = result.capacity["pointsman-423"].rate
    assert [level for level, _ in result.levels] == [0.5, 1.0]
    for level, runs in result.levels:
        assert set(runs) == {"pointsman-423", "round-robin"}
        assert {r.rate for r in runs.values()} == {level * reference}
        assert all(r.finished + r.rejected == r.requests for r in runs.values())
    probes = sum(len(c.probes) for c in result.capacity.values())
    assert sweep.runs + sweep.reused == probes + 4
    assert sweep.reused >= 1  # the reference at level 1.0 is its last passing probe
    assert result.levels[1][1]["pointsman-423"] in result.capacity["pointsman-423"].probes


def test_the_reference_must_be_a_contender() -> None:
    s = scenario(contenders=["round-robin"])
    with ThreadPoolExecutor(1) as pool, pytest.raises(ValueError, match="reference"):
        Sweep(s, contenders(s, PROFILES), pool, levels=(1.0,), duration=1.0).variant(engine_configs(s), None)


def test_a_level_at_a_probed_rate_is_that_probe_whatever_the_float_arithmetic() -> None:
    """A level's rate is a fraction times the reference's capacity (1.1 x 75 = 82.50000000000001);
    a probe at the same rate must be the same run, judged alike, or the search and the levels
    disagree about one rate."""
    s = scenario(contenders=["pointsman-423", "round-robin"])
    built = contenders(s, PROFILES)
    engines = engine_configs(s)
    with ThreadPoolExecutor(2) as pool:
        found = Sweep(s, built, pool, levels=(), duration=2.0).variant(engines, None).capacity
    reference = found["pointsman-423"].rate
    probe = found["round-robin"].probes[0]
    near = probe.rate / reference
    # A level whose rate is the probe's to 1e-15 but not to the last bit.
    level = next(
        x for x in (near, math.nextafter(near, 0), math.nextafter(near, 9)) if x * reference != probe.rate
    )
    with ThreadPoolExecutor(2) as pool:
        sweep = Sweep(s, built, pool, levels=(level,), duration=2.0)
        result = sweep.variant(engines, None)
    assert result.levels[0][1]["round-robin"] == probe
    assert sweep.reused >= 1


def test_level_runs_against_a_capacity_are_found() -> None:
    result = VariantResult(
        "",
        capacity={"a": Capacity(80.0), "b": Capacity(20.0, lower_bound_only=True), "c": Capacity(50.0)},
        levels=[
            (0.5, {"a": stats(rate=40.0), "b": stats(rate=40.0), "c": stats(rate=40.0, ttft_p99_s=3.0)}),
            (1.1, {"a": stats(rate=88.0), "b": stats(rate=88.0), "c": stats(rate=88.0, unserved=2)}),
        ],
    )
    against = contradictions(result, 2.0)
    assert {name: [level for level, _ in runs] for name, runs in against.items()} == {
        "a": [1.1],  # passes above its capacity
        "c": [0.5],  # fails below it
    }  # b: passing above a lower bound agrees


def test_the_method_says_how_capacity_was_found() -> None:
    s = scenario(load={"repeats": 2, "capacity": {"p99TtftBelow": "1.5s", "startRps": 8, "precision": 0.1}})
    method = CapacityMethod.of(s, 30.0)
    text = method.text()
    for part in (
        "p99 TTFT under 1.5 s",
        "every request served",
        "doubling from 8 req/s",
        "10%",
        "30 s of arrivals",
        "2 repeat(s)",
        "seed 3, repeats 0, 1",
        "no warm-up",
        "a level at a probed rate is that probe",
    ):
        assert part in text
    doc = method.as_dict()
    assert doc["seeds"] == ["3:0", "3:1"]
    assert (doc["repeats"], doc["duration_s"], doc["warmup_s"]) == (2, 30.0, 0.0)
