"""Arrival traces for the virtual-time driver; randomness comes from the caller's ``random.Random``."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from pointsman_sim.fleet import TraceRequest

# ShareGPT-like lengths (the dataset vLLM's benchmark_serving uses, Llama tokenizer): log-normal with
# means of ~202 prompt and ~179 output tokens (the published averages of its ShareGPT runs) and a
# long tail; clipped to the benchmark's limits.
SHAREGPT_PROMPT = (math.log(113.0), 1.1, 4, 2048)  # (mu, sigma, min, max)
SHAREGPT_OUTPUT = (math.log(118.0), 0.95, 4, 1024)


def lognormal(rng: random.Random, shape: tuple[float, float, int, int]) -> int:
    mu, sigma, low, high = shape
    return min(high, max(low, round(rng.lognormvariate(mu, sigma))))


def sharegpt_like(
    rng: random.Random,
    count: int,
    *,
    rate: float | None,
    adapters: Sequence[str | None] = (None,),
) -> list[TraceRequest]:
    """``count`` requests with ShareGPT-like lengths; Poisson arrivals at ``rate`` per second, or all
    at time 0 when ``rate`` is ``None``; each request's adapter drawn uniformly from ``adapters``."""
    now = 0.0
    trace = []
    for _ in range(count):
        if rate is not None:
            now += rng.expovariate(rate)
        trace.append(
            TraceRequest(
                now, lognormal(rng, SHAREGPT_PROMPT), lognormal(rng, SHAREGPT_OUTPUT), rng.choice(adapters)
            )
        )
    return trace


def fixed(
    count: int, prompt_tokens: int, max_tokens: int, *, adapter: str | None = None
) -> list[TraceRequest]:
    """``count`` identical requests, all arriving at time 0."""
    return [TraceRequest(0.0, prompt_tokens, max_tokens, adapter) for _ in range(count)]
