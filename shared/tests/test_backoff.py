from __future__ import annotations

import random

import pytest

from pointsman_shared.backoff import Backoff, Jitter

BASE = Backoff(initial=0.5, factor=2.0, maximum=10.0)


@pytest.mark.parametrize(
    ("attempt", "ceiling"),
    [(0, 0.5), (1, 0.5), (2, 1.0), (3, 2.0), (5, 8.0), (6, 10.0), (60, 10.0), (5000, 10.0)],
)
def test_the_ceiling_grows_by_the_factor_up_to_the_cap(attempt: int, ceiling: float) -> None:
    assert BASE.ceiling(attempt) == ceiling
    assert BASE.delay(attempt, random.Random(0)) == ceiling  # no jitter: the ceiling itself


@pytest.mark.parametrize(
    ("jitter", "low", "high"),
    [(Jitter.NONE, 1.0, 1.0), (Jitter.FULL, 0.0, 1.0), (Jitter.EQUAL, 0.5, 1.0)],
)
def test_jitter_stays_within_its_band_and_covers_it(jitter: Jitter, low: float, high: float) -> None:
    backoff = Backoff(initial=0.25, factor=4.0, maximum=1.0, jitter=jitter)
    rng = random.Random(7)
    delays = [backoff.delay(2, rng) for _ in range(2000)]
    assert all(low <= d <= high for d in delays)
    assert min(delays) - low < 0.01
    assert high - max(delays) < 0.01


def test_the_same_seed_gives_the_same_delays() -> None:
    backoff = Backoff(initial=0.1, maximum=5.0, jitter=Jitter.FULL)
    first = [backoff.delay(n, random.Random(3)) for n in range(1, 8)]
    assert first == [backoff.delay(n, random.Random(3)) for n in range(1, 8)]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial": 0.0, "maximum": 1.0},
        {"initial": 2.0, "maximum": 1.0},
        {"initial": 0.1, "maximum": 1.0, "factor": 0.5},
    ],
    ids=["zero initial", "initial over the cap", "shrinking"],
)
def test_nonsense_parameters_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(**kwargs)
