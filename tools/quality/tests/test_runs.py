"""One run's figures: percentiles, and repeats pooled."""

from __future__ import annotations

from pathlib import Path

import pytest
from quality_builders import scenario

from pointsman_quality.contenders import contenders
from pointsman_quality.runs import percentile, run
from pointsman_quality.scenario import engine_configs

PROFILES = Path(__file__).resolve().parents[3] / "config" / "profiles"


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([], 0.5, 0.0),
        ([1.0], 0.99, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 0.5, 2.0),
        (list(range(1, 101)), 0.9, 90),
        (list(range(1, 101)), 0.99, 99),
    ],
)
def test_nearest_rank_percentiles(values, p, expected) -> None:
    assert percentile(values, p) == expected


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
