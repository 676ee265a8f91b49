"""The flow controllers' dispatches shared by the picker replicas through Redis: the I/O side of
:class:`~pointsman_picker.flowcontrol.peers.PeerView`.

Every ``interval`` each picker writes its report (its assignments a scrape has not shown yet, and how
many requests it holds) into its own field of the pool's hash (``pointsman:{pool}:dispatches``),
refreshes the hash's expiry and reads every field, in one pipelined round trip. A field whose report
has not changed for ``forget`` seconds (its picker died without deleting it), or that is not a
report, is deleted by whoever reads it; a picker that stops deletes its own. The hash expires
``forget`` after the last write, so it does not outlive the pickers. Memory in Redis: one report per
picker, at most 256 times per pod.

While Redis is unreachable each picker routes by its own view (the peers' reports expire after the
view's ``ttl``); nothing errors. One key with the pool's hash tag: one server, Sentinel or a cluster.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping

from pointsman_picker.flowcontrol.controller import FlowController
from pointsman_picker.flowcontrol.peers import PeerView, Report, decode, encode
from pointsman_picker.interfaces import SnapshotSource
from pointsman_picker.redis_rounds import RedisRounds, default_origin
from pointsman_picker.snapshots import RETRY
from pointsman_shared.backoff import Backoff
from pointsman_shared.keys import RedisKeys
from pointsman_shared.redis_client import RedisClient
from pointsman_shared.redis_url import RedisTarget

log = logging.getLogger(__name__)


class RedisPeerSync(RedisRounds):
    def __init__(
        self,
        target: RedisTarget | str,
        keys: RedisKeys,
        controller: Callable[[], FlowController | None],
        source: SnapshotSource,
        *,
        horizon: float,
        clock: Callable[[], float],
        origin: str | None = None,
        interval: float = 0.02,
        ttl: float = 1.0,
        forget: float = 30.0,
        io_timeout: float = 0.5,
        backoff: Backoff = RETRY,
        rng: random.Random | None = None,
    ) -> None:
        """``controller`` is this picker's (called each round: it is built after this); ``horizon``
        the oldest assignment that counts (``picker.maxStaleness``)."""
        super().__init__(
            target,
            name="peer-sync",
            what="flow control",
            unreachable="counting this picker's dispatches only",
            interval=interval,
            io_timeout=io_timeout,
            backoff=backoff,
            rng=rng,
        )
        self._key = keys.dispatches
        self._controller = controller
        self._source = source
        self._horizon = horizon
        self._clock = clock
        self.view = PeerView(origin or default_origin(), ttl=ttl)
        self._forget = forget
        self._sequence = 0
        self._cached: tuple[object, int, float, dict[str, int]] | None = None
        self.rounds = 0

    @property
    def origin(self) -> str:
        return self.view.origin

    def extra(self) -> Mapping[str, int]:
        """The flow controller's ``peers``: the peers' part of each pod, for the current snapshot
        (computed once per snapshot and report, and at least every 10 ms while peers are live)."""
        snapshot = self._source.current()
        controller = self._controller()
        if snapshot is None or controller is None:
            return {}
        now = self._clock()
        cached = self._cached
        view = self.view
        if (
            cached is not None
            and cached[0] is snapshot
            and cached[1] == view.generation
            and now - cached[2] < 0.01
        ):
            return cached[3]
        counts = view.extra(snapshot.pods, controller.thresholds, now, horizon=self._horizon)
        self._cached = (snapshot, view.generation, now, counts)
        return counts

    def alone(self) -> None:
        self.view.update({}, self._clock())  # alone until Redis answers again

    async def farewell(self, client: RedisClient) -> None:
        await client.hdel(self._key, self.origin)  # stop counting at once for the others

    async def sync(self) -> None:
        """One round: write this picker's report, read the others'."""
        assert self._client is not None, "start() first"
        controller = self._controller()
        self._sequence += 1
        if controller is not None:
            report = encode(self._sequence, controller.waiting, controller.dispatches())
        else:
            report = encode(self._sequence, 0, {})
        async with asyncio.timeout(self._io_timeout):
            pipe = self._client.pipeline(transaction=False)
            pipe.hset(self._key, self.origin, report)
            pipe.pexpire(self._key, int(self._forget * 1000))
            pipe.hgetall(self._key)
            results = await pipe.execute()
            fields: dict[bytes, bytes] = results[-1]
            reports: dict[str, Report] = {}
            dead: list[str | bytes] = []
            for origin, blob in fields.items():
                try:
                    reports[origin.decode()] = decode(blob)
                except (ValueError, UnicodeDecodeError):
                    log.warning("flow control: field %r of %s is not a report; deleted", origin, self._key)
                    dead.append(origin)
            now = self._clock()
            self.view.update(reports, now)
            dead.extend(self.view.stale(now, after=self._forget))
            if dead:
                await self._client.hdel(self._key, *dead)
        self.rounds += 1
