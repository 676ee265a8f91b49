"""Collector replicas sharing one pool: ownership, leases, the merged snapshot (a dead replica's pods kept
until their new owner has read them), and 3 replicas with one killed."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from pointsman_collector.sharing import EXPIRY_MARGIN, Membership, ShardSink, Share, owner
from pointsman_devstack.ports import free_port
from pointsman_shared.codec import decode_pool
from pointsman_shared.keys import RedisKeys
from pointsman_shared.snapshot import PodSnapshot, PoolSnapshot

PODS = tuple(f"10.0.0.{i}:8000" for i in range(1, 61))


def test_every_replica_computes_the_same_owner_and_the_split_is_even() -> None:
    members = ["a", "b", "c"]
    owners = [owner(pod, members) for pod in PODS]
    assert owners == [owner(pod, reversed(members)) for pod in PODS]
    assert min(Counter(owners).values()) >= 10  # 60 pods over 3: no replica starves
    assert owner("x:1", []) is None


def test_a_replica_leaving_moves_only_its_pods() -> None:
    before = {pod: owner(pod, ["a", "b", "c"]) for pod in PODS}
    after = {pod: owner(pod, ["a", "b"]) for pod in PODS}
    assert all(after[pod] == before[pod] for pod in PODS if before[pod] != "c")


def test_share_follows_endpoints_and_members() -> None:
    applied: list[tuple[str, ...]] = []
    share = Share("a", applied.append)
    share.set_endpoints(PODS)
    assert share.owned == PODS  # alone: everything
    share.set_members(["a", "b"])
    assert share.owned == tuple(p for p in PODS if owner(p, ["a", "b"]) == "a")
    share.set_members(["b", "a"])  # same members: nothing to do
    assert len(applied) == 2


def pool_of(*pods: PodSnapshot) -> PoolSnapshot:
    return PoolSnapshot(pool='p"1', version=0, published_at=1764000000.5, pods=pods)


async def test_shards_merge_into_one_snapshot_and_a_dead_replicas_stale_shard_is_dropped(
    redis_url: str,
) -> None:
    keys = RedisKeys('p"1')
    client = Redis.from_url(redis_url)
    try:
        await client.zadd(keys.members, {"a": 10**15, "b": 10**15})  # both leases far in the future
        a = ShardSink(client, keys, me="a", ttl=5.0)
        b = ShardSink(client, keys, me="b", ttl=5.0)
        await a.publish(
            pool_of(PodSnapshot("10.0.0.2:1", waiting=1, updated_at=5.0), PodSnapshot("10.0.0.1:1"))
        )
        # A pod handed over from a to b: b's newer reading wins.
        version = await b.publish(pool_of(PodSnapshot("10.0.0.2:1", waiting=2, updated_at=6.0)))
        data = await client.hget(keys.snapshot, "data")
        snapshot = decode_pool(data, version)
        assert snapshot.pool == 'p"1'
        assert [(p.address, p.waiting) for p in snapshot.pods] == [("10.0.0.1:1", 0), ("10.0.0.2:1", 2)]

        await client.zrem(keys.members, "a")  # a's lease is gone
        version = await b.publish(pool_of(PodSnapshot("10.0.0.2:1", waiting=3, updated_at=7.0)))
        snapshot = decode_pool(await client.hget(keys.snapshot, "data"), version)
        assert [(p.address, p.waiting) for p in snapshot.pods] == [("10.0.0.2:1", 3)]
        assert await client.hkeys(keys.shards) == [b"b"]
    finally:
        await client.aclose()


NOW = 1764000000.0
STALENESS = 2.0


def at(published: float, *pods: PodSnapshot) -> PoolSnapshot:
    return PoolSnapshot(pool="p", version=0, published_at=published, pods=pods)


def good(address: str, waiting: int, updated: float) -> PodSnapshot:
    return PodSnapshot(address, waiting=waiting, updated_at=updated)


def pending(address: str) -> PodSnapshot:
    return PodSnapshot(address, healthy=False, reason="pending")


async def test_a_dead_replicas_pods_stay_published_until_their_new_owner_has_read_them(
    redis_url: str,
) -> None:
    keys = RedisKeys("p")
    client = Redis.from_url(redis_url)

    async def merged(sink: ShardSink, pool: PoolSnapshot) -> dict[str, tuple[bool, str, int]]:
        version = await sink.publish(pool)
        snapshot = decode_pool(await client.hget(keys.snapshot, "data"), version)
        return {p.address: (p.healthy, p.reason, p.waiting) for p in snapshot.pods}

    try:
        await client.zadd(keys.members, {"a": 10**15, "b": 10**15})
        a = ShardSink(client, keys, me="a", ttl=5.0, staleness=STALENESS)
        b = ShardSink(client, keys, me="b", ttl=5.0, staleness=STALENESS)
        await a.publish(at(NOW, good("p1", 1, NOW), good("p2", 2, NOW), pending("p5")))
        await b.publish(at(NOW, good("p3", 3, NOW)))
        await client.zrem(keys.members, "a")  # a died: its lease ran out

        # b has not seen it yet (no p1, p2 in its share): a's last readings stay.
        assert await merged(b, at(NOW + 0.1, good("p3", 3, NOW + 0.1))) == {
            "p1": (True, "", 1), "p2": (True, "", 2), "p3": (True, "", 3),
        }  # fmt: skip
        # b took them over and has not scraped them yet: its "pending" does not hide a's data. A pod new
        # to the pool (p4, in no other shard) is pending; a's own pending p5 is not kept.
        took_over = at(NOW + 0.2, pending("p1"), pending("p2"), good("p3", 3, NOW), pending("p4"))
        assert await merged(b, took_over) == {
            "p1": (True, "", 1), "p2": (True, "", 2), "p3": (True, "", 3), "p4": (False, "pending", 0),
        }  # fmt: skip
        # b's first scrapes replace them, a failed one too (no data, but newer word than a's).
        failed = PodSnapshot("p2", healthy=False, reason="connect")
        assert await merged(b, at(NOW + 0.3, good("p1", 7, NOW + 0.3), failed, good("p3", 3, NOW))) == {
            "p1": (True, "", 7), "p2": (False, "connect", 0), "p3": (True, "", 3),
        }  # fmt: skip
        assert set(await client.hkeys(keys.shards)) == {b"a", b"b"}  # a's data is within staleness still

        # Past collector.staleness a dead replica's data is never published as fresh; its shard goes.
        later = NOW + STALENESS + 0.01
        assert await merged(b, at(later, pending("p1"), good("p3", 3, later))) == {
            "p1": (False, "pending", 0), "p3": (True, "", 3),
        }  # fmt: skip
        assert await client.hkeys(keys.shards) == [b"b"]
    finally:
        await client.aclose()


async def test_a_live_replicas_reading_beats_a_dead_ones_even_when_older(redis_url: str) -> None:
    keys = RedisKeys("p")
    client = Redis.from_url(redis_url)
    try:
        await client.zadd(keys.members, {"a": 10**15, "b": 10**15})
        a = ShardSink(client, keys, me="a", ttl=5.0)
        b = ShardSink(client, keys, me="b", ttl=5.0)
        await a.publish(at(NOW, good("p1", 1, NOW)))
        await client.zrem(keys.members, "a")
        stale = PodSnapshot("p1", waiting=2, updated_at=NOW - 0.5, healthy=False, reason="timeout")
        version = await b.publish(at(NOW + 0.1, stale))
        [pod] = decode_pool(await client.hget(keys.snapshot, "data"), version).pods
        assert (pod.healthy, pod.reason, pod.waiting) == (False, "timeout", 2)
    finally:
        await client.aclose()


async def test_a_survivor_sees_a_dead_peer_just_after_its_lease_runs_out(redis_url: str) -> None:
    lease = 0.9  # renewals every 0.3 s: without the early look, seen up to 0.3 s after the lease ends
    keys = RedisKeys("p")
    client = Redis.from_url(redis_url)
    renewed = 0.0  # the dead peer's last renewal, on the monotonic clock
    alone = asyncio.Event()

    def on_members(members: list[str]) -> None:
        if renewed and members == ["survivor"]:
            alone.set()

    dead = Membership(client, keys, me="dead", lease=lease, on_members=lambda _: None)
    survivor = Membership(client, keys, me="survivor", lease=lease, on_members=on_members)
    try:
        assert await survivor.renew_lease() == (["survivor"], None)
        running = asyncio.create_task(survivor.run())
        await asyncio.sleep(0.05)
        members, peer_ends = await dead.renew_lease()  # its last renewal
        renewed = time.monotonic()
        assert sorted(members) == ["dead", "survivor"]
        assert peer_ends is not None
        assert 2 * lease / 3 - 0.1 < peer_ends <= lease
        async with asyncio.timeout(5):
            await alone.wait()
        assert lease - 0.01 <= time.monotonic() - renewed <= lease + EXPIRY_MARGIN + 0.1
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        assert await client.zrange(keys.members, 0, -1) == []  # the survivor left on its way out
    finally:
        await client.aclose()


# --- three replicas, one killed -------------------------------------------------------------------


async def start_replica(config: Path) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pointsman_collector", "--config", str(config), env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip


@pytest.fixture
async def replicas(tmp_path: Path, redis_url: str, pod_server, fixture_page):  # type: ignore[no-untyped-def]
    pods = [await pod_server(fixture_page("vllm-current-lora")) for _ in range(6)]
    processes: list[asyncio.subprocess.Process] = []
    urls: list[str] = []
    for i in range(3):
        config = tmp_path / f"collector-{i}.yaml"
        endpoints = ", ".join(f"'{p.address}'" for p in pods)
        urls.append(f"http://127.0.0.1:{free_port()}")
        config.write_text(
            f"pool:\n  name: shared\n  endpoints: [{endpoints}]\nredis:\n  url: {redis_url}\n"
            f"collector:\n  listen: {urls[-1].removeprefix('http://')}\n  sharing: true\n"
            "  leaseTtl: 300ms\n"
        )
        processes.append(await start_replica(config))
    client = Redis.from_url(redis_url)
    yield pods, processes, urls, client
    for process in processes:
        if process.returncode is None:
            process.kill()
            await process.wait()
    await client.aclose()


async def wait_until(check) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(15):
        while True:
            if await check():
                return
            await asyncio.sleep(0.05)


async def test_three_replicas_split_the_pool_and_the_survivors_take_over_a_killed_ones_pods(
    replicas,
) -> None:  # type: ignore[no-untyped-def]
    pods, processes, urls, client = replicas
    keys = RedisKeys("shared")

    async def members() -> int:
        return int(await client.zcard(keys.members))

    async def whole_pool_healthy() -> bool:
        version, data = await client.hmget(keys.snapshot, ["version", "data"])
        if data is None:
            return False
        snapshot = decode_pool(data, int(version))
        return sorted(p.address for p in snapshot.pods if p.healthy) == sorted(p.address for p in pods)

    async def one_scraper_per_pod() -> bool:
        return all(p.open_connections == 1 for p in pods)

    async def three() -> bool:
        return await members() == 3

    async def two() -> bool:
        return await members() == 2

    await wait_until(three)
    await wait_until(whole_pool_healthy)
    await wait_until(one_scraper_per_pod)  # each pod scraped by exactly one replica

    processes[0].send_signal(signal.SIGKILL)  # no goodbye: its lease must run out
    await processes[0].wait()
    await wait_until(two)
    before = [p.requests for p in pods]
    await wait_until(one_scraper_per_pod)
    await wait_until(whole_pool_healthy)

    async def every_pod_scraped_again() -> bool:
        return all(p.requests > seen + 2 for p, seen in zip(pods, before, strict=True))

    await wait_until(every_pod_scraped_again)

    async def survivors_report_their_shares() -> bool:
        # Each survivor's /metrics: two live replicas, and their owned pods add up to the pool.
        async with httpx.AsyncClient(timeout=5.0) as http:
            pages = [(await http.get(f"{url}/metrics")).text for url in urls[1:]]
        gauges = [
            {m.name: m.samples[0].value for m in text_string_to_metric_families(page) if m.samples}
            for page in pages
        ]
        return all(g["pointsman_collector_live_replicas"] == 2 for g in gauges) and sum(
            g["pointsman_collector_owned_pods"] for g in gauges
        ) == len(pods)

    await wait_until(survivors_report_their_shares)
