"""A live run's figures, taken as the virtual runs take theirs, and the client's send lag."""

from __future__ import annotations

import dataclasses

import pytest

from pointsman_quality.live_stats import RequestResult, live_stats, prefix_cache_totals, send_lag
from pointsman_sim.fleet import TraceRequest


def test_live_stats_take_percentiles_as_the_virtual_runs_do_after_the_warmup() -> None:
    trace = [TraceRequest(1.0 + i, 1, 5) for i in range(14)]  # the first 2 arrive before 3 s
    results = [
        RequestResult(True, 100.0 + i, 110.0 + i, ttft=i / 10, tpot=0.01 * i, output_tokens=5)
        for i in range(12)
    ]
    results.append(RequestResult(False, 112.0, 113.0, error="HTTP 503"))
    stats = live_stats(2.0, trace, results, since=3.0)
    # Counted: arrivals 3..14 s (12 requests): sends 102..111 ok, 112 failed, one never reported.
    assert (stats.requests, stats.finished, stats.failed) == (12, 10, 2)
    assert stats.ttft_p50_s == pytest.approx(0.6)  # nearest rank: the 5th of 0.2 .. 1.1
    assert stats.ttft_p90_s == pytest.approx(1.0)
    assert stats.ttft_p99_s == pytest.approx(1.1)
    assert stats.e2e_p90_s == pytest.approx(10.0)
    assert stats.tokens_per_s == pytest.approx(50 / (121.0 - 102.0))
    assert live_stats(2.0, trace, results).finished == 12
    # Every request reported: the k-th send is the k-th arrival, however early it went out.
    early = [dataclasses.replace(r, start=r.start - 0.2) if i == 2 else r for i, r in enumerate(results)]
    early.append(RequestResult(True, 113.0, 114.0, ttft=0.1, tpot=0.01, output_tokens=5))
    counted = live_stats(2.0, trace, early, since=3.0)
    assert (counted.requests, counted.finished) == (12, 11)


def test_send_lag_is_each_send_against_its_arrival_after_the_first() -> None:
    trace = [TraceRequest(0.5 + 0.1 * i, 1, 1) for i in range(10)]
    results = [RequestResult(True, 100.0 + 0.1 * i + (0.02 if i == 9 else 0.0), 101.0) for i in range(10)]
    lag = send_lag(trace, results)
    assert lag["p50"] == pytest.approx(0.0, abs=1e-6)
    assert lag["max"] == pytest.approx(20.0)
    assert send_lag(trace, results[:3]) == {}


POD_PAGE = """# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 300.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 120.0
vllm:num_requests_running{model_name="m"} 1.0
"""
V0_PAGE = 'vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.4\n'


@pytest.mark.parametrize(
    ("pages", "totals"),
    [
        ([POD_PAGE], (300.0, 120.0)),
        ([POD_PAGE, POD_PAGE], (600.0, 240.0)),  # summed over pods
        ([POD_PAGE, V0_PAGE], None),  # a pod without the counters: no hit rate rather than a wrong one
        ([], (0.0, 0.0)),
    ],
)
def test_prefix_cache_totals_sum_every_pods_counters(
    pages: list[str], totals: tuple[float, float] | None
) -> None:
    assert prefix_cache_totals(pages) == totals
