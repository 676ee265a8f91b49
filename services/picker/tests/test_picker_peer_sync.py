"""Flow control's dispatches shared through a real Redis: two pickers see each other's assignments and
split a pod's room, a stopped picker deletes its report, a dead one's is deleted by the others, a value
that is not a report is skipped, and an outage leaves each picker alone without errors."""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from picker_builders import NOW, config, ctx, pod, snapshot

from pointsman_devstack.redis_server import RedisServer, start_redis
from pointsman_picker.director import Director
from pointsman_picker.flowcontrol.controller import FlowController
from pointsman_picker.flowcontrol.peers import encode
from pointsman_picker.interfaces import NoMetrics
from pointsman_picker.peer_sync import RedisPeerSync
from pointsman_picker.snapshots import StaticSnapshotSource
from pointsman_shared.backoff import Backoff
from pointsman_shared.keys import RedisKeys
from pointsman_testkit.waiting import eventually

KEYS = RedisKeys("peer-pool")
A, B = "10.0.0.1:8000", "10.0.0.2:8000"
FAST = Backoff(initial=0.02, maximum=0.1)
CONFIG = config(flowControl={"enabled": True, "saturationDetector": {"queueDepthThreshold": 4}})


class Picker:
    """A flow controller over a snapshot the test sets, its clock the test's."""

    def __init__(self, source: StaticSnapshotSource, clock: list[float]) -> None:
        self.clock = lambda: clock[0]
        self.director = Director(
            CONFIG, source, NoMetrics(), rng=random.Random(1), clock=self.clock, timer=time.perf_counter
        )
        self.sync: RedisPeerSync | None = None
        self.flow = FlowController(
            self.director, CONFIG, clock=self.clock, peers=lambda: self.sync.extra() if self.sync else {}
        )


@contextlib.asynccontextmanager
async def syncing(
    url: str, picker: Picker, source: StaticSnapshotSource, **kwargs
) -> AsyncIterator[RedisPeerSync]:
    sync = RedisPeerSync(
        url,
        KEYS,
        lambda: picker.flow,
        source,
        horizon=5.0,
        clock=picker.clock,
        interval=0.01,
        backoff=FAST,
        **kwargs,
    )
    picker.sync = sync
    await sync.start()
    try:
        yield sync
    finally:
        await sync.aclose()


def scrape(source: StaticSnapshotSource, clock: list[float], *waiting: int) -> None:
    source.set(
        snapshot(*(pod(w, address=a, updated_at=clock[0]) for w, a in zip(waiting, (A, B), strict=True)))
    )
    clock[0] += 0.001


async def test_two_pickers_count_each_other_s_dispatches(redis_url):
    clock = [NOW]
    source = StaticSnapshotSource()
    scrape(source, clock, 0, 4)  # room 4 on A, none on B
    one, two = Picker(source, clock), Picker(source, clock)
    async with syncing(redis_url, one, source) as s1, syncing(redis_url, two, source) as s2:
        await eventually(lambda: s1.rounds > 1 and s2.rounds > 1, within=10)
        for i in range(3):
            one.flow.route(ctx(b'{"model":"my-model","prompt":"hi"}', request_id=f"r{i}"))
        clock[0] += 0.5  # a new report is fresh (the views judge by this clock)
        await eventually(lambda: two.sync is not None and two.sync.extra() == {A: 3}, within=10)
        assert s1.extra() == {}
        assert s1.failures == s2.failures == 0
    client = aioredis.Redis.from_url(redis_url)
    try:  # each deleted its report when it stopped
        assert await client.hgetall(KEYS.dispatches) == {}
    finally:
        await client.aclose()


async def test_a_dead_picker_s_report_and_a_value_that_is_not_one_are_dropped(redis_url):
    clock = [NOW]
    source = StaticSnapshotSource()
    scrape(source, clock, 0, 4)
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.hset(KEYS.dispatches, mapping={"dead": encode(1, 9, {A: [NOW + 1]}), "junk": b"x"})
        picker = Picker(source, clock)
        async with syncing(redis_url, picker, source, ttl=1.0, forget=2.0) as sync:
            await eventually(lambda: sync.rounds > 0, within=10)
            await eventually(lambda: _fields_are(client, {"dead", sync.origin}), within=10)  # junk deleted
            assert sync.extra() == {A: 2}  # the dead one, fresh as far as this picker knows: half of A
            clock[0] += 1.5  # its report has not changed for longer than the view's ttl
            await eventually(lambda: sync.extra() == {}, within=10)
            clock[0] += 1.0  # nor for longer than ``forget``: deleted
            await eventually(lambda: _fields_are(client, {sync.origin}), within=10)
            assert sync.failures == 0
    finally:
        await client.aclose()


async def _fields_are(client: aioredis.Redis, expected: set[str]) -> bool:
    return {k.decode() for k in await client.hkeys(KEYS.dispatches)} == expected


@pytest.fixture
def own_redis():
    server: RedisServer = start_redis(
        {k: v for k, v in os.environ.items() if k != "REDIS_URL"}, allow_docker=False
    )
    try:
        yield server
    finally:
        server.stop()


async def test_an_outage_leaves_each_picker_alone_without_errors(own_redis):
    clock = [NOW]
    source = StaticSnapshotSource()
    scrape(source, clock, 0, 4)
    one, two = Picker(source, clock), Picker(source, clock)
    async with syncing(own_redis.url, one, source) as s1, syncing(own_redis.url, two, source) as s2:
        one.flow.route(ctx(b'{"model":"my-model","prompt":"hi"}'))
        clock[0] += 0.5
        await eventually(lambda: s2.extra() == {A: 1}, within=10)
        own_redis.kill()
        await eventually(lambda: s1.failures > 0 and s2.failures > 0, within=10)
        assert s2.extra() == {}  # its own view only
        two.flow.route(ctx(b'{"model":"my-model","prompt":"hi"}'))  # routing goes on
        own_redis.restart()
        clock[0] += 0.5
        await eventually(lambda: s1.failures == s2.failures == 0, within=10)
        await eventually(lambda: s1.extra() == {A: 1} and s2.extra() == {A: 1}, within=10)
