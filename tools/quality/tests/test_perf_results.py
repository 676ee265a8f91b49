"""What inference-perf reports back, and the trace as it really sent it."""

from __future__ import annotations

import json

from pointsman_quality.live_stats import RequestResult
from pointsman_quality.perf_results import as_sent, perf_results
from pointsman_quality.prompts import prompt_text
from pointsman_sim.fleet import TraceRequest


def perf_entry(
    start: float, model: str, prompt_tokens: int, max_tokens: int, **metrics: object
) -> dict[str, object]:
    body = {
        "model": model,
        "prompt": prompt_text(prompt_tokens),
        "max_tokens": max_tokens,
        "stream": True,
    }
    return {
        "start_time": start,
        "end_time": start + 2.0,
        "request": json.dumps(body),
        "computed_metrics": {
            "time_to_first_token": 0.25,
            "time_per_output_token": 0.05,
            "output_tokens": max_tokens,
            **metrics,
        },
        "error": None,
    }


def test_perf_results_read_inference_perfs_per_request_report() -> None:
    failed = {
        "start_time": 9.0,
        "end_time": 9.5,
        "request": "{}",
        "error": {"error_type": "HTTP Error 503", "error_msg": "no healthy upstream"},
    }
    ok, bad = perf_results([perf_entry(1.0, "hot-1", 12, 30), failed])
    assert ok == RequestResult(True, 1.0, 3.0, 0.25, 0.05, 30, "hot-1", None, 12, 30)
    assert (bad.ok, bad.ttft, bad.error) == (False, None, "HTTP Error 503: no healthy upstream")


def test_as_sent_gives_the_virtual_replay_the_models_inference_perf_drew() -> None:
    trace = [
        TraceRequest(0.1, 10, 20, "hot-0"),
        TraceRequest(0.2, 11, 21, "hot-1"),
        TraceRequest(0.3, 12, 22),
    ]
    # The second and third sends swapped places; the first went out for the base model.
    results = perf_results(
        [
            perf_entry(5.0, "base", 10, 20),
            perf_entry(5.2, "cold-2", 12, 22),
            perf_entry(5.21, "warm-1", 11, 21),
        ]
    )
    replayed, matched = as_sent(trace, results, "base")
    assert matched == 3
    assert [r.adapter for r in replayed] == [None, "warm-1", "cold-2"]
    assert [(r.arrival, r.prompt_tokens, r.max_tokens) for r in replayed] == [
        (r.arrival, r.prompt_tokens, r.max_tokens) for r in trace
    ]
