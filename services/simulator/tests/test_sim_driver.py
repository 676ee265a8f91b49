from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from pointsman_sim.driver import EngineDriver, PodClosed
from pointsman_sim.engine import Engine, EngineConfig, StepResult

FAST = 1000.0  # a 7 ms step takes 7 µs


def driver(speedup: float = FAST) -> EngineDriver:
    return EngineDriver(Engine(EngineConfig()), speedup=speedup)


async def test_delivers_every_token_then_the_finish() -> None:
    steps: list[StepResult] = []
    async with EngineDriver(Engine(EngineConfig()), speedup=FAST, on_step=steps.append) as d:
        stream = d.submit("r1", 10, 5, None)
        counts = [n async for n in stream.tokens()]
    assert counts == [1] * 5
    assert stream.result is not None
    assert stream.result.output_tokens == 5
    assert sum(len(s.tokens) for s in steps) == 5


async def test_requests_share_steps() -> None:
    async with driver() as d:
        streams = [d.submit(f"r{i}", 10, 3, None) for i in range(4)]
        await asyncio.gather(*(_drain(s.tokens()) for s in streams))
        assert d.engine.totals().generation_tokens == 12
        assert all(s.done for s in streams)


async def test_steps_take_simulated_time_over_speedup() -> None:
    loop = asyncio.get_running_loop()
    async with driver(speedup=10.0) as d:
        started = loop.time()
        await _drain(d.submit("r1", 10, 10, None).tokens())  # 10 steps of ~7 ms = 70 ms simulated
        elapsed = loop.time() - started
    assert 0.006 <= elapsed <= 0.1


async def test_cancel_removes_the_request() -> None:
    async with driver(speedup=1.0) as d:
        d.submit("r1", 10, 1000, None)
        await asyncio.sleep(0.02)
        d.cancel("r1")
        assert not d.engine.has_work
        assert d.engine.totals().aborted == 1


async def test_pending_requests_end_with_pod_closed() -> None:
    async with driver(speedup=1.0) as d:
        stream = d.submit("r1", 10, 1000, None)
    with pytest.raises(PodClosed):
        await _drain(stream.tokens())


async def test_submit_needs_a_running_driver() -> None:
    with pytest.raises(PodClosed):
        driver().submit("r1", 10, 1, None)


async def _drain(tokens: AsyncIterator[int]) -> None:
    async for _ in tokens:
        pass
