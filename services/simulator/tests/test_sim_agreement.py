"""The real-time driver and the virtual-time driver agree: the same 4 pods and 2 minutes of traffic
give TTFT and e2e medians within 15% of each other.

The real-time run uses ``speedup`` 10, so its 2 simulated minutes take about 12 s of wall time.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from contextlib import AsyncExitStack

import pytest

from pointsman_shared.stats import median
from pointsman_sim.engine import FinishedRequest
from pointsman_sim.fleet import RoundRobin, TraceRequest, run_fleet
from pointsman_sim.pod import PodSpec, SimPod
from pointsman_sim.profiles import load_profile
from pointsman_sim.traces import sharegpt_like

PODS = 4
SPEEDUP = 10.0
CONFIG = load_profile("llama-3.1-8b-h100").engine


def trace() -> list[TraceRequest]:
    requests = sharegpt_like(random.Random(11), 1500, rate=12.0)
    return [r for r in requests if r.arrival < 120.0]


async def real_time(requests: Sequence[TraceRequest]) -> list[FinishedRequest]:
    pods = [SimPod(PodSpec(name=f"pod-{i}", engine=CONFIG, speedup=SPEEDUP)) for i in range(PODS)]
    loop = asyncio.get_running_loop()

    async def one(index: int, request: TraceRequest, start: float) -> FinishedRequest:
        await asyncio.sleep(max(0.0, start + request.arrival / SPEEDUP - loop.time()))
        stream = pods[index % PODS].driver.submit(
            f"r{index}", request.prompt_tokens, request.max_tokens, None
        )
        async for _ in stream.tokens():
            pass
        assert stream.result is not None
        return stream.result

    async with AsyncExitStack() as stack:
        for pod in pods:
            await stack.enter_async_context(pod)
        start = loop.time()
        return list(await asyncio.gather(*(one(i, r, start) for i, r in enumerate(requests))))


async def test_real_time_and_virtual_time_medians_agree() -> None:
    requests = trace()
    virtual = [s.request for s in run_fleet([CONFIG] * PODS, requests, RoundRobin()).served]
    real = await real_time(requests)
    assert len(real) == len(virtual) == len(requests)
    for measure in ("time_to_first_token", "e2e_latency"):
        real_median = median(getattr(r, measure) for r in real)
        virtual_median = median(getattr(r, measure) for r in virtual)
        assert real_median == pytest.approx(virtual_median, rel=0.15), measure
