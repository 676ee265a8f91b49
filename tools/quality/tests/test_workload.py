"""Traces from a scenario's traffic: shares, arrival processes, the same requests at every rate."""

from __future__ import annotations

from collections import Counter

import pytest
from quality_builders import scenario

from pointsman_quality.workload import ModelMix, build_trace


def test_groups_share_their_traffic_equally_or_by_zipf() -> None:
    s = scenario(
        traffic={
            "baseShare": 0.2,
            "adapters": [
                {"prefix": "even", "count": 2, "share": 0.4},
                {"prefix": "zipf", "count": 2, "share": 0.4, "zipf": 1.0},
            ],
        }
    )
    mix = ModelMix.of(s.traffic)
    assert mix.names == (None, "even-0", "even-1", "zipf-0", "zipf-1")
    assert mix.weights == pytest.approx((0.2, 0.2, 0.2, 0.4 * 2 / 3, 0.4 / 3))
    assert mix.adapters == ("even-0", "even-1", "zipf-0", "zipf-1")


def test_the_trace_follows_the_shares_and_the_rate() -> None:
    s = scenario(traffic={"baseShare": 0.5, "adapters": [{"prefix": "a", "count": 1, "share": 0.5}]})
    trace = build_trace(s, 200.0, 50.0)
    assert len(trace) == pytest.approx(10_000, rel=0.05)
    counts = Counter(r.adapter for r in trace)
    assert counts[None] / len(trace) == pytest.approx(0.5, abs=0.03)
    assert all(0 <= r.arrival < 50.0 for r in trace)
    assert [r.arrival for r in trace] == sorted(r.arrival for r in trace)


def test_every_rate_sends_the_same_requests_only_faster() -> None:
    s = scenario()
    slow, fast = build_trace(s, 10.0, 20.0), build_trace(s, 40.0, 20.0)
    shared = min(len(slow), len(fast))
    strip = [(r.prompt_tokens, r.max_tokens, r.adapter) for r in slow[:shared]]
    assert strip == [(r.prompt_tokens, r.max_tokens, r.adapter) for r in fast[:shared]]
    assert build_trace(s, 10.0, 20.0) == slow  # and the same seed gives the same trace


def test_on_off_arrivals_come_in_bursts_at_the_peak_rate_with_the_same_mean() -> None:
    s = scenario(traffic={"baseShare": 1, "arrivals": {"process": "on-off", "peakFactor": 3, "onSeconds": 2}})
    trace = build_trace(s, 30.0, 60.0)
    assert len(trace) == pytest.approx(30 * 60, rel=0.1)
    in_bursts = [r for r in trace if (r.arrival % 6.0) < 2.0]  # each period: 2 s on, 4 s off
    assert len(in_bursts) == len(trace)


def test_fixed_lengths() -> None:
    s = scenario(
        traffic={"baseShare": 1, "lengths": {"dataset": "fixed", "promptTokens": 7, "outputTokens": 9}}
    )
    assert {(r.prompt_tokens, r.max_tokens) for r in build_trace(s, 50.0, 2.0)} == {(7, 9)}


def test_a_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        build_trace(scenario(), 0.0, 1.0)
