"""The prefix index shared through a real Redis: two pickers converge, a picker that starts (or a
producer a reload makes) loads the current index, the stream stays bounded and expires, an entry that
is not an announcement is skipped, and an outage (the server killed, then back) degrades to the
local index without errors and catches up."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from picker_builders import pod, pool_pods

from pointsman_devstack.redis_server import RedisServer, start_redis
from pointsman_picker.prefix_sync import RedisPrefixSync, decode, encode
from pointsman_picker.scheduling import CycleState, SchedulingRequest, Ticket
from pointsman_picker.scheduling.assignments import POSITIONS
from pointsman_picker.scheduling.prefix_cache import PREFIX_MATCH, Announcement, PrefixCacheProducer
from pointsman_shared.backoff import Backoff
from pointsman_shared.keys import RedisKeys
from pointsman_testkit.waiting import eventually

KEYS = RedisKeys("sync-pool")
PODS = pool_pods(pod(), pod(), pod())
A, B, C = (p.address for p in PODS)
PROMPT = "You are a helpful assistant. " * 40  # 18 blocks
FAST = Backoff(initial=0.02, maximum=0.1)


def req(text: str = PROMPT) -> SchedulingRequest:
    return SchedulingRequest("m", True, {"model": "m", "prompt": text})


def state_for(producer: PrefixCacheProducer, request: SchedulingRequest) -> CycleState:
    state = CycleState()
    state[POSITIONS] = {p.address: i for i, p in enumerate(PODS)}
    producer.prepare(request, PODS, state, 0.0)
    return state


def route(producer: PrefixCacheProducer, address: str, request: SchedulingRequest | None = None) -> None:
    request = request or req()
    producer.picked(Ticket(1, address, 1.0), request, state_for(producer, request))


def matched(producer: PrefixCacheProducer, request: SchedulingRequest | None = None) -> dict[str, int]:
    return dict(state_for(producer, request or req())[PREFIX_MATCH].matched)


@contextlib.asynccontextmanager
async def syncing(url: str, *producers: PrefixCacheProducer, **kwargs) -> AsyncIterator[RedisPrefixSync]:
    held = list(producers)
    sync = RedisPrefixSync(url, KEYS, lambda: held, interval=0.01, backoff=FAST, io_timeout=1.0, **kwargs)
    sync.held = held  # type: ignore[attr-defined]  # the running "profile": a test may swap it
    await sync.start()
    try:
        yield sync
    finally:
        await sync.aclose()


def test_an_entry_round_trips():
    announcements = [
        Announcement(A, (1, 2**64 - 1), 1.5),
        Announcement(B, (3,), 2.0),
        Announcement(A, (4,), 2.0),
    ]
    origin, back = decode(encode("me", announcements))
    assert origin == "me"
    assert back == [Announcement(A, (1, 2**64 - 1, 4), 2.0), Announcement(B, (3,), 2.0)]


async def test_two_pickers_converge(redis_url):
    one, two = PrefixCacheProducer(auto_tune=False), PrefixCacheProducer(auto_tune=False)
    async with syncing(redis_url, one), syncing(redis_url, two):
        route(one, A)
        await eventually(lambda: matched(two) == {A: 18}, within=10)
        route(two, B, req(PROMPT + "more " * 30))
        await eventually(lambda: matched(one, req(PROMPT + "more " * 30)) == {A: 18, B: 20}, within=10)
        assert matched(two) == {A: 18, B: 18}
        assert one.outbox() == two.outbox() == 0


async def test_a_starting_picker_and_a_reloaded_producer_load_the_current_index(redis_url):
    one = PrefixCacheProducer(auto_tune=False)
    async with syncing(redis_url, one) as first:
        route(one, A)
        await eventually(lambda: first.published == 1, within=10)
        late = PrefixCacheProducer(auto_tune=False)
        async with syncing(redis_url, late) as second:
            await eventually(lambda: matched(late) == {A: 18}, within=10)
            reloaded = PrefixCacheProducer(auto_tune=False, capacity=100)  # another spec: a new index
            second.held[:] = [reloaded]  # type: ignore[attr-defined]
            await eventually(lambda: matched(reloaded) == {A: 18}, within=10)


async def test_the_stream_is_bounded_and_expires(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    producer = PrefixCacheProducer(auto_tune=False)
    try:
        async with syncing(redis_url, producer, batch=1, max_entries=100) as sync:
            route(producer, A, req("x" * 64 * 256))  # 256 blocks, one an entry
            await eventually(lambda: sync.published == 256, within=10)
            assert await client.xlen(KEYS.prefix_index) <= 200  # MAXLEN ~ 100: whole nodes of 100
        later = [1e12]
        async with syncing(redis_url, ttl=600.0, clock=lambda: later[0]):
            await eventually(lambda: _empty(client), within=10)
    finally:
        await client.aclose()


async def _empty(client: aioredis.Redis) -> bool:
    return await client.xlen(KEYS.prefix_index) == 0


async def test_an_entry_that_is_not_an_announcement_is_skipped(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.xadd(KEYS.prefix_index, {"junk": "1"})
        await client.xadd(KEYS.prefix_index, {"o": "other", "t": "1.0", A: b"123"})  # not 8-byte hashes
        one, two = PrefixCacheProducer(auto_tune=False), PrefixCacheProducer(auto_tune=False)
        async with syncing(redis_url, one), syncing(redis_url, two) as sync:
            route(one, C)
            await eventually(lambda: matched(two) == {C: 18}, within=10)
            assert sync.failures == 0
    finally:
        await client.aclose()


@pytest.fixture
def own_redis():
    server: RedisServer = start_redis(
        {k: v for k, v in os.environ.items() if k != "REDIS_URL"}, allow_docker=False
    )
    try:
        yield server
    finally:
        server.stop()


async def test_an_outage_degrades_to_the_local_index_and_recovery_catches_up(own_redis):
    one, two = PrefixCacheProducer(auto_tune=False), PrefixCacheProducer(auto_tune=False)
    async with syncing(own_redis.url, one) as first, syncing(own_redis.url, two) as second:
        route(one, A)
        await eventually(lambda: matched(two) == {A: 18}, within=10)
        own_redis.kill()
        other = req("Another system prompt entirely. " * 30)
        route(one, B, other)  # routing goes on by the local index
        assert matched(one, other) == {B: len(state_for(one, other)[PREFIX_MATCH].hashes)}
        await eventually(lambda: first.failures > 0 and second.failures > 0, within=10)
        assert matched(two, other) == {}
        own_redis.restart()  # empty: it kept nothing on disk (blocks the loop until it answers PING)
        await eventually(lambda: bool(matched(two, other)), within=10)
        await eventually(lambda: first.failures == second.failures == 0, within=10)
