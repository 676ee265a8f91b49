"""The one rule every bench and tool summarises a sample by: known values, empty input, bad fractions."""

from __future__ import annotations

import random

import pytest

from pointsman_shared.stats import PERCENTILE_RULE, PERCENTILE_RULE_TEXT, mean, median, percentile


def upto(n: int) -> list[float]:
    """1..n: each value is its own rank."""
    return [float(i) for i in range(1, n + 1)]


@pytest.mark.parametrize(
    ("n", "p", "rank"),
    [
        (1, 0.5, 1),
        (1, 0.9, 1),
        (1, 0.99, 1),
        (2, 0.5, 1),  # p·n = 1
        (2, 0.9, 2),  # 1.8 -> 2
        (2, 0.99, 2),
        (10, 0.5, 5),
        (10, 0.9, 9),
        (10, 0.99, 10),  # 9.9 -> 10
        (100, 0.5, 50),
        (100, 0.9, 90),
        (100, 0.99, 99),
        (101, 0.5, 51),  # 50.5: a half goes up
        (101, 0.9, 91),  # 90.9
        (101, 0.99, 100),  # 99.99
        (170, 0.99, 168),  # 168.3: rounded, where ceil(p·n) would take 169
        (10, 0.0, 1),
        (10, 1.0, 10),
    ],
)
def test_the_percentile_is_the_value_of_rank_round_p_n(n: int, p: float, rank: int) -> None:
    values = upto(n)
    assert percentile(values, p) == rank
    random.Random(n).shuffle(values)  # any order
    assert percentile(values, p) == rank
    assert percentile(iter(values), p) == rank  # any iterable


def test_the_percentile_is_always_one_of_the_values() -> None:
    assert percentile([0.1, 10.0], 0.5) == 0.1
    assert percentile([3.0, 1.0, 2.0, 100.0], 0.9) == 100.0


def test_no_values_have_no_percentile_unless_a_default_is_given() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 0.5)
    assert percentile([], 0.99, empty=0.0) == 0.0
    assert percentile([2.0], 0.99, empty=0.0) == 2.0


@pytest.mark.parametrize("p", [-0.01, 1.01, 50, 99.0])
def test_a_percentile_is_a_fraction(p: float) -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        percentile([1.0, 2.0], p)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (upto(1), 1.0),
        (upto(2), 1.5),  # the mean of the middle two: not a percentile
        (upto(10), 5.5),
        (upto(100), 50.5),
        (upto(101), 51.0),
        ([5.0, 1.0, 3.0], 3.0),
    ],
)
def test_median(values: list[float], expected: float) -> None:
    assert median(values) == expected


@pytest.mark.parametrize(
    ("values", "expected"),
    [(upto(1), 1.0), (upto(2), 1.5), (upto(10), 5.5), (upto(101), 51.0), ([1, 2, 6], 3.0)],
)
def test_mean(values: list[float], expected: float) -> None:
    assert mean(values) == expected


@pytest.mark.parametrize("summary", [median, mean])
def test_no_values_have_no_median_or_mean(summary) -> None:
    with pytest.raises(ValueError, match="of no values"):
        summary([])


def test_the_rule_is_named_for_the_reports() -> None:
    assert PERCENTILE_RULE == "nearest-rank"
    assert "round(p·n)" in PERCENTILE_RULE_TEXT
