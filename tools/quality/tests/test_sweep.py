"""The capacity search and a whole sweep over a tiny scenario."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from quality_builders import scenario, stats

from pointsman_quality.contenders import contenders
from pointsman_quality.scenario import engine_configs
from pointsman_quality.sweep import Sweep, find_capacity, passes

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
        ({"rejected": 1}, False),  # a shed request is load not served
        ({"finished": 99}, False),
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
    assert sweep.runs == probes + 4


def test_the_reference_must_be_a_contender() -> None:
    s = scenario(contenders=["round-robin"])
    with ThreadPoolExecutor(1) as pool, pytest.raises(ValueError, match="reference"):
        Sweep(s, contenders(s, PROFILES), pool, levels=(1.0,), duration=1.0).variant(engine_configs(s), None)
