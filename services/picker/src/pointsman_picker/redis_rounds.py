"""What the picker replicas share through Redis, as a background task of rounds: one :meth:`sync`
every ``interval``; a failed round is logged once (until one succeeds again), the task backs off and
:meth:`alone` tells the subclass to go on with its own view. Nothing of it raises into routing.

Each round is bounded with ``asyncio.timeout`` (``ClientOptions.caller_bounded``), as the snapshot
reader's are (:mod:`pointsman_picker.snapshots`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket

from redis.exceptions import RedisError

from pointsman_shared.backoff import Backoff
from pointsman_shared.redis_client import ClientOptions, RedisClient, create_client
from pointsman_shared.redis_url import RedisTarget, parse_redis_url

log = logging.getLogger(__name__)

FAILURES: tuple[type[Exception], ...] = (RedisError, OSError, TimeoutError)


def default_origin() -> str:
    """This picker's name among its replicas: host, process and a random part (a restart is new)."""
    return f"{socket.gethostname()}:{os.getpid()}:{random.getrandbits(32):08x}"


class RedisRounds:
    """``name`` names the task; ``what`` and ``unreachable`` the log lines (``"prefix index"``,
    ``"routing by this picker's own index"``); ``failures`` are the exceptions a round may end with."""

    def __init__(
        self,
        target: RedisTarget | str,
        *,
        name: str,
        what: str,
        unreachable: str,
        interval: float,
        io_timeout: float,
        backoff: Backoff,
        rng: random.Random | None,
        failures: tuple[type[Exception], ...] = FAILURES,
    ) -> None:
        self._target = parse_redis_url(target) if isinstance(target, str) else target
        self._name = name
        self._what = what
        self._unreachable = unreachable
        self._interval = interval
        self._io_timeout = io_timeout
        self._backoff = backoff
        self._rng = rng if rng is not None else random.Random()
        self._failure_types = failures
        self._client: RedisClient | None = None
        self._task: asyncio.Task[None] | None = None
        self.failures = 0  # rounds failed in a row

    async def sync(self) -> None:
        """One round (``start()`` first)."""
        raise NotImplementedError

    def alone(self) -> None:
        """A round failed: go on without the others until one succeeds."""

    async def farewell(self, client: RedisClient) -> None:
        """What to tell the others before the client closes (bounded by ``io_timeout``)."""

    async def start(self) -> None:
        self._client = create_client(self._target, ClientOptions.caller_bounded(self._io_timeout))
        self._task = asyncio.create_task(self._loop(), name=self._name)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task], timeout=2.0)
            self._task = None
        if self._client is not None:
            try:
                async with asyncio.timeout(self._io_timeout):
                    await self.farewell(self._client)
            except self._failure_types:
                pass
            await self._client.aclose()
            self._client = None

    async def _loop(self) -> None:
        while True:
            try:
                await self.sync()
            except self._failure_types as exc:
                self.failures += 1
                self.alone()
                if self.failures == 1:
                    log.warning("%s: Redis unreachable, %s: %s", self._what, self._unreachable, exc)
                await asyncio.sleep(self._backoff.delay(self.failures, self._rng))
                continue
            if self.failures:
                log.info("%s: Redis answers again after %d failures", self._what, self.failures)
                self.failures = 0
            await asyncio.sleep(self._interval)
