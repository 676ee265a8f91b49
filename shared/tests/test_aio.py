from __future__ import annotations

import asyncio

from pointsman_shared.aio import wait_event


async def test_wait_event_says_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    event.set()
    assert await wait_event(event, 0.01) is True


async def test_a_loop_of_waits_ends_when_cancelled() -> None:
    async def loop() -> None:
        while True:
            await wait_event(asyncio.Event(), 0)

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.01)
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=1.0)
    assert done
    assert task.cancelled()
