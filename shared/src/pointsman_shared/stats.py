"""Summaries of a sample, one rule for every bench and tool: percentiles, median, mean.

Every report the benches and tools write takes its percentiles here, so a p99 in one report means
what it means in another, and says so (:data:`PERCENTILE_RULE`, :data:`PERCENTILE_RULE_TEXT`).

The rule is nearest rank: the ``p`` percentile of ``n`` sorted values is the one of rank
``round(p * n)`` (halves up), clamped to ``1..n``. It is always one of the values (no interpolation),
so a p99 TTFT is a request that really waited that long. This is the textbook nearest-rank rank
(``ceil(p * n)``) rounded instead of raised: the two differ only where ``p * n`` has a fraction
under one half (p99 of 170 values: rank 168, not 169). No library computes this rule
(``statistics.quantiles`` and numpy's default interpolate), and the routing-quality figures have
always been taken by it. The median is the usual one (the mean of the two middle values of an even
count), as :func:`statistics.median` computes it; a p50 is a percentile, by the rule above.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

PERCENTILE_RULE = "nearest-rank"
"""The ``percentile_rule`` field of every json report."""

PERCENTILE_RULE_TEXT = (
    "Percentiles by nearest rank: of n sorted values, the one of rank round(p·n) (halves up) within "
    "1..n, no interpolation."
)
"""The sentence every markdown report carries."""


def percentile(values: Iterable[float], p: float, *, empty: float | None = None) -> float:
    """The ``p`` percentile (``0 <= p <= 1``) of ``values``, in any order, by nearest rank.

    No values: ``empty`` when given, else :class:`ValueError`, as :func:`statistics.median` does."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"a percentile is a fraction in [0, 1], got {p}")
    ordered = sorted(values)
    if not ordered:
        if empty is None:
            raise ValueError("the percentile of no values")
        return empty
    # int(x + 0.5) rounds halves up (round() would round them to even).
    return ordered[min(len(ordered) - 1, max(0, int(p * len(ordered) + 0.5) - 1))]


def median(values: Iterable[float]) -> float:
    """The median of ``values`` (the mean of the two middle ones for an even count); no values:
    :class:`ValueError`."""
    data = list(values)
    if not data:
        raise ValueError("the median of no values")
    return float(statistics.median(data))


def mean(values: Iterable[float]) -> float:
    """The arithmetic mean of ``values``, in floating point; no values: :class:`ValueError`."""
    data = list(values)
    if not data:
        raise ValueError("the mean of no values")
    return statistics.fmean(data)
