"""Waiting, in a test, for something that happens in the background."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], *, within: float = 3.0, interval: float = 0.01
) -> None:
    """Return once ``check()`` (a plain or an async callable) is true; fail the test after ``within``
    seconds with what was checked."""
    try:
        async with asyncio.timeout(within):
            while True:
                result = check()
                if inspect.isawaitable(result):
                    result = await result
                if result:
                    return
                await asyncio.sleep(interval)
    except TimeoutError:
        name = getattr(check, "__qualname__", repr(check))
        raise AssertionError(f"{name} not true within {within} s") from None
