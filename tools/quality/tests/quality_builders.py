"""Tiny builders shared by the quality benchmark's tests, and the picker's (``picker_builders``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# The picker's builders live beside its tests; a conftest here would shadow the other suites' ones.
_PICKER_TESTS = str(Path(__file__).resolve().parents[3] / "services" / "picker" / "tests")
if _PICKER_TESTS not in sys.path:
    sys.path.append(_PICKER_TESTS)

from picker_builders import (  # noqa: E402
    body,
    metadata,
    on_free_ports,
    pod,
    pool_pods,
    post_headers,
    set_headers,
)

from pointsman_quality.runs import RunStats  # noqa: E402
from pointsman_quality.scenario import Scenario, parse_scenario  # noqa: E402

__all__ = [
    "body",
    "lora_scenario",
    "metadata",
    "on_free_ports",
    "pod",
    "pool_pods",
    "post_headers",
    "scenario",
    "set_headers",
    "stats",
]


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


def lora_scenario(**extra: object) -> Scenario:
    """The live bench's tests' scenario: 4 pods, 15 adapters (5 hot with 60% of the traffic, 5 warm
    with 30%, 5 cold with 10%); ``extra`` keys laid over its document."""
    doc = {
        "name": "live-test",
        "seed": 3,
        "fleet": {"pods": 4, "engine": {"maxLoras": 4}},
        "traffic": {
            "adapters": [
                {"prefix": "hot", "count": 5, "share": 0.6},
                {"prefix": "warm", "count": 5, "share": 0.3},
                {"prefix": "cold", "count": 5, "share": 0.1},
            ]
        },
        **extra,
    }
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
        "unserved": 0,
    }
    base.update(values)
    return RunStats(**base)
