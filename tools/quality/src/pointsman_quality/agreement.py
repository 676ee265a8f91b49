"""Live against virtual: the ratio of each compared figure, and whether the required ones agree."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pointsman_quality.live_stats import LiveStats
from pointsman_quality.runs import RunStats

AGREEMENT_METRICS = ("ttft_p50_s", "ttft_p90_s")
"""Must agree within the tolerance; the others are shown for what they tell."""
COMPARED_METRICS = (*AGREEMENT_METRICS, "ttft_p99_s", "tpot_p90_s", "e2e_p90_s", "tokens_per_s")
TOLERANCE = 0.2


def agreement(
    live: LiveStats | Mapping[str, float],
    virtual: RunStats | Mapping[str, float],
    tolerance: float = TOLERANCE,
) -> dict[str, Any]:
    """``live / virtual`` for each compared metric, and whether the required ones (p50 and p90 TTFT)
    are within ``tolerance`` of 1 (a ratio of ``None``: the virtual value is 0)."""
    live_values = live.as_dict() if isinstance(live, LiveStats) else dict(live)
    virtual_values = virtual.as_dict() if isinstance(virtual, RunStats) else dict(virtual)
    ratios: dict[str, float | None] = {}
    for name in COMPARED_METRICS:
        base = float(virtual_values[name])
        ratios[name] = float(live_values[name]) / base if base > 0 else None
    agrees = all(
        (ratio := ratios[name]) is not None and abs(ratio - 1.0) <= tolerance for name in AGREEMENT_METRICS
    )
    return {"ratios": ratios, "agrees": agrees, "tolerance": tolerance}
