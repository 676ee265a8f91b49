"""Tiny builders shared by the quality benchmark's tests."""

from __future__ import annotations

from typing import Any

from pointsman_quality.runs import RunStats
from pointsman_quality.scenario import Scenario, parse_scenario


def scenario(**overrides: Any) -> Scenario:
    """A small scenario (2 pods, two adapters, 2 s runs) with ``overrides`` laid over its document."""
    doc: dict[str, Any] = {
        "name": "tiny",
        "seed": 3,
        "fleet": {"pods": 2, "engine": {"maxLoras": 1}},
        "traffic": {"adapters": [{"prefix": "a", "count": 2, "share": 1}]},
        "load": {"levels": [0.5, 1.0], "duration": "2s", "capacity": {"startRps": 4, "precision": 0.25}},
        "quick": {"levels": [0.5], "duration": "1s"},
    }
    doc.update(overrides)
    return parse_scenario(doc)


def stats(**values: float) -> RunStats:
    base: dict[str, Any] = {
        "rate": 10.0,
        "requests": 100,
        "finished": 100,
        "rejected": 0,
        "ttft_p50_s": 0.05,
        "ttft_p90_s": 0.1,
        "ttft_p99_s": 0.2,
        "tpot_p90_s": 0.02,
        "e2e_p90_s": 2.0,
        "tokens_per_s": 1000.0,
        "adapter_loads_disk": 3,
        "adapter_loads_cpu": 1,
        "max_pod_share": 0.5,
    }
    base.update(values)
    return RunStats(**base)
