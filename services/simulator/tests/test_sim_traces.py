from __future__ import annotations

import itertools
import random

from pointsman_shared.stats import mean
from pointsman_sim.traces import fixed, sharegpt_like


def test_sharegpt_like_lengths_average_the_published_means() -> None:
    trace = sharegpt_like(random.Random(0), 20_000, rate=10.0, adapters=("a", None))
    assert 185 < mean(r.prompt_tokens for r in trace) < 220  # published 202
    assert 165 < mean(r.max_tokens for r in trace) < 195  # published 179
    assert 1_900 < trace[-1].arrival < 2_100  # Poisson at 10/s
    assert all(a.arrival <= b.arrival for a, b in itertools.pairwise(trace))
    assert {r.adapter for r in trace} == {"a", None}


def test_sharegpt_like_without_rate_arrives_at_once() -> None:
    assert {r.arrival for r in sharegpt_like(random.Random(0), 10, rate=None)} == {0.0}


def test_fixed() -> None:
    assert [(r.prompt_tokens, r.max_tokens, r.adapter) for r in fixed(2, 5, 6, adapter="x")] == [
        (5, 6, "x")
    ] * 2
