"""asyncio helpers the services share. Not part of the pure core."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def raise_if_cancelling() -> None:
    """End the current task if a cancel() was turned into a TimeoutError and swallowed.

    On Python 3.11, a cancel() that lands while an ``asyncio.timeout`` expires can leave the block as
    TimeoutError. A loop that handles timeouts then never stops, and whoever awaits the task waits
    forever (seen in the collector benchmark, about one run in three). The task still counts the
    cancel: honour it.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def wait_event(event: asyncio.Event, seconds: float) -> bool:
    """Wait until ``event`` is set or ``seconds`` pass; return whether it was set.

    Uses asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation (gh-86296).
    """
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        raise_if_cancelling()
        return False
    return True


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run a service's main coroutine on uvloop where it is installed, else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
