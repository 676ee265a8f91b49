"""The rounds both shared views run (prefix index, flow-control dispatches): a failed round backs
off, goes on alone and is logged once until one succeeds again; closing says farewell first."""

from __future__ import annotations

import asyncio
import logging

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from pointsman_picker.redis_rounds import RedisRounds, default_origin
from pointsman_shared.backoff import Backoff


class Scripted(RedisRounds):
    """Rounds that fail or succeed as ``script`` says (an exception to raise, or None), then succeed."""

    def __init__(self, script: list[Exception | None]) -> None:
        super().__init__(
            "redis://127.0.0.1:1",
            name="scripted",
            what="scripted view",
            unreachable="going on alone",
            interval=0.001,
            io_timeout=0.5,
            backoff=Backoff(initial=0.001, maximum=0.001),
            rng=None,
        )
        self.script = list(script)
        self.events: list[str] = []
        self.done = asyncio.Event()

    async def sync(self) -> None:
        step = self.script.pop(0) if self.script else None
        if not self.script:
            self.done.set()
        if step is not None:
            self.events.append("fail")
            raise step
        self.events.append("ok")

    def alone(self) -> None:
        self.events.append(f"alone after {self.failures}")

    async def farewell(self, client: object) -> None:
        self.events.append("farewell")


FAILS = [RedisConnectionError("refused"), OSError("reset"), TimeoutError()]


@pytest.mark.parametrize("failure", FAILS, ids=lambda e: type(e).__name__)
async def test_a_failed_round_goes_on_alone_and_is_logged_once_until_one_succeeds(failure, caplog):
    rounds = Scripted([failure, failure, None, failure, None])
    caplog.set_level(logging.INFO, logger="pointsman_picker.redis_rounds")
    await rounds.start()
    await asyncio.wait_for(rounds.done.wait(), 5)
    await rounds.aclose()
    assert rounds.events[:7] == [
        "fail",
        "alone after 1",
        "fail",
        "alone after 2",
        "ok",
        "fail",
        "alone after 1",
    ]
    assert rounds.events[-1] == "farewell"
    messages = [r.getMessage() for r in caplog.records]
    assert sum("Redis unreachable, going on alone" in m for m in messages) == 2  # once per outage
    assert sum("Redis answers again after 2 failures" in m for m in messages) == 1


async def test_an_exception_outside_the_failures_ends_the_task():
    rounds = Scripted([ValueError("a bug")])
    await rounds.start()
    assert rounds._task is not None
    with pytest.raises(ValueError, match="a bug"):
        await asyncio.wait_for(rounds._task, 5)
    await rounds.aclose()


def test_origins_differ_between_replicas_of_one_host():
    assert default_origin() != default_origin()
