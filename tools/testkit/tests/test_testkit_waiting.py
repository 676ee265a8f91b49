"""eventually: returns when the condition holds, fails the test when it never does."""

from __future__ import annotations

import asyncio

import pytest

from pointsman_testkit import eventually


async def test_returns_once_a_plain_check_turns_true() -> None:
    calls = []
    await eventually(lambda: calls.append(1) or len(calls) >= 3, interval=0)
    assert len(calls) == 3


async def test_awaits_an_async_check() -> None:
    event = asyncio.Event()
    asyncio.get_running_loop().call_later(0.02, event.set)

    async def is_set() -> bool:
        return event.is_set()

    await eventually(is_set)
    assert event.is_set()


async def test_fails_with_what_was_checked_when_never_true() -> None:
    def never() -> bool:
        return False

    with pytest.raises(AssertionError, match=r"never not true within 0\.05 s"):
        await eventually(never, within=0.05)
