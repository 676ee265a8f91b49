"""RedisSnapshotSource against a real Redis, written the way the collector writes it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from urllib.parse import urlparse

import pytest
import redis.asyncio as aioredis
from picker_builders import pod, snapshot

from pointsman_picker.snapshots import RedisSnapshotSource, StaticSnapshotSource
from pointsman_shared.backoff import Backoff
from pointsman_shared.cluster import ClusterObjective, ClusterObjects
from pointsman_shared.cluster_codec import encode_cluster, stamp
from pointsman_shared.codec import encode_pool
from pointsman_shared.keys import RedisKeys
from pointsman_shared.snapshot import PoolSnapshot
from pointsman_testkit import eventually

KEYS = RedisKeys("test-pool")
FAST = Backoff(initial=0.02, maximum=0.1)


async def publish(client: aioredis.Redis, snap: PoolSnapshot, *, announce: bool = True) -> int:
    """The collector's publish: version from the counter, hash written atomically with a TTL, then PUBLISH."""
    version = await client.incr(KEYS.sequence)
    async with client.pipeline(transaction=True) as pipe:
        pipe.hset(KEYS.snapshot, mapping={"version": version, "data": encode_pool(snap)})
        pipe.expire(KEYS.snapshot, 10)
        if announce:
            pipe.publish(KEYS.channel, version)
        await pipe.execute()
    return version


@pytest.fixture
async def client(redis_url):
    c = aioredis.Redis.from_url(redis_url)
    yield c
    await c.aclose()


@contextlib.asynccontextmanager
async def running(url: str, **kwargs):
    source = RedisSnapshotSource(url, KEYS, backoff=FAST, **kwargs)
    await source.start()
    try:
        yield source
    finally:
        await source.aclose()


def version_of(source) -> int | None:
    snap = source.current()
    return None if snap is None else snap.version


async def test_reads_the_published_snapshot(redis_url, client):
    version = await publish(client, snapshot(pod(3, 0.5, 2, {"a"}, address="10.0.0.1:8000")))
    async with running(redis_url, poll_interval=0.05) as source:
        await asyncio.wait_for(source.wait_ready(), 3)
        current = source.current()
        assert current.version == version
        assert current.pods == (pod(3, 0.5, 2, {"a"}, address="10.0.0.1:8000"),)


async def test_a_publish_announcement_refreshes_without_waiting_for_the_poll(redis_url, client):
    await publish(client, snapshot(pod()))
    async with running(redis_url, poll_interval=60) as source:
        await asyncio.wait_for(source.wait_ready(), 3)
        deadline = time.monotonic() + 3
        while (await client.pubsub_numsub(KEYS.channel))[0][1] < 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        version = await publish(client, snapshot(pod(waiting=9)))
        await eventually(lambda: version_of(source) == version, within=2)
        assert source.current().pods[0].waiting == 9


async def test_polling_catches_a_missed_announcement(redis_url, client):
    await publish(client, snapshot(pod()))
    async with running(redis_url, poll_interval=0.05) as source:
        await asyncio.wait_for(source.wait_ready(), 3)
        version = await publish(client, snapshot(pod(waiting=4)), announce=False)
        await eventually(lambda: version_of(source) == version)


async def test_an_expired_snapshot_means_no_snapshot(redis_url, client):
    await publish(client, snapshot(pod()))
    async with running(redis_url, poll_interval=0.05) as source:
        await asyncio.wait_for(source.wait_ready(), 3)
        await client.delete(KEYS.snapshot)
        await eventually(lambda: source.current() is None)


async def test_a_bad_blob_keeps_the_last_copy(redis_url, client):
    version = await publish(client, snapshot(pod()))
    async with running(redis_url, poll_interval=0.02) as source:
        await asyncio.wait_for(source.wait_ready(), 3)
        await client.hset(KEYS.snapshot, mapping={"version": version + 1, "data": b"not a snapshot"})
        await asyncio.sleep(0.2)
        assert version_of(source) == version


async def test_the_same_version_with_other_data_is_read(redis_url, client):
    # A Sentinel failover can hand out a version again: the new primary's counter lagged the old one's.
    version = await publish(client, snapshot(pod(waiting=1)))
    async with running(redis_url, poll_interval=0.02) as source:
        await asyncio.wait_for(source.wait_ready(), 3)
        await client.hset(
            KEYS.snapshot, mapping={"version": version, "data": encode_pool(snapshot(pod(waiting=7)))}
        )
        await eventually(lambda: source.current().pods[0].waiting == 7)
        assert version_of(source) == version


async def test_a_subscription_that_hears_nothing_is_made_again(redis_url, client):
    await publish(client, snapshot(pod()))
    async with running(redis_url, poll_interval=60, silence=0.2) as source:
        await asyncio.wait_for(source.wait_ready(), 3)
        await eventually(lambda: _subscribers(client), within=2)
        first = await _subscribers(client)
        await eventually(lambda: _subscribers(client, other_than=first), within=2)
        assert (await client.pubsub_numsub(KEYS.channel))[0][1] == 1  # one subscription, not a pile
        version = await publish(client, snapshot(pod(waiting=3)))
        await eventually(lambda: version_of(source) == version, within=2)


async def _subscribers(client, other_than=()):
    """The ids of the connections subscribed to the channel, when there are some not in ``other_than``."""
    ids = {c["id"] for c in await client.client_list(_type="pubsub")}
    return ids if ids - set(other_than) else set()


async def test_unreachable_redis_is_survived(unused_port):
    async with running(f"redis://127.0.0.1:{unused_port}/0", poll_interval=0.05, io_timeout=0.3) as source:
        await asyncio.sleep(0.3)
        assert source.current() is None


async def test_an_outage_keeps_the_last_copy_and_recovery_catches_up(redis_url, client):
    target = urlparse(redis_url)
    proxy = TcpProxy(target.hostname, target.port)
    await proxy.start()
    first = await publish(client, snapshot(pod()))
    async with running(f"redis://127.0.0.1:{proxy.port}/0", poll_interval=0.05, io_timeout=0.3) as source:
        await asyncio.wait_for(source.wait_ready(), 3)
        await proxy.stop()  # Redis "goes away" for the picker
        second = await publish(client, snapshot(pod(waiting=2)))
        await asyncio.sleep(0.3)
        assert version_of(source) == first  # the last copy still serves
        await proxy.start()  # same port: Redis is back
        await eventually(lambda: version_of(source) == second, within=5)
    await proxy.stop()


async def test_static_source():
    source = StaticSnapshotSource()
    assert source.current() is None
    source.set(snapshot(pod(), version=3))
    await asyncio.wait_for(source.wait_ready(), 1)
    assert source.current().version == 3


@pytest.fixture
def unused_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TcpProxy:
    """A loopback TCP proxy that can be cut and restored on the same port."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await task
        await self._server.wait_closed()
        self._server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        self._writers.add(writer)
        up_writer = None
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
            self._writers.add(up_writer)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                if w is not None:
                    self._writers.discard(w)
                    w.close()
                    with contextlib.suppress(ConnectionError, OSError):
                        await w.wait_closed()
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()


# --- the cluster objects beside the snapshot ---------------------------------------------------------


async def put_cluster(client: aioredis.Redis, blob: bytes, *, announce: bool = True) -> None:
    """The collector's cluster write (cluster_sink): stamp and blob, then a notification."""
    await client.hset(KEYS.cluster, mapping={"stamp": stamp(blob), "data": blob})
    if announce:
        await client.publish(KEYS.channel, "cluster")


def objects(*priorities: int) -> ClusterObjects:
    gie = "inference.networking.x-k8s.io/v1alpha2"
    return ClusterObjects(
        objectives=tuple(ClusterObjective(f"o{i}", gie, 1, p) for i, p in enumerate(priorities))
    )


async def test_cluster_objects_are_read_and_handed_on_and_the_last_good_set_stays(redis_url, client):
    await publish(client, snapshot(pod(0, 0.1, address="10.0.0.1:8000")))
    applied: list[ClusterObjects] = []
    async with running(redis_url, poll_interval=60.0) as source:
        source.watch_cluster(applied.append)
        await put_cluster(client, encode_cluster(objects(1)))
        await eventually(lambda: applied == [objects(1)])
        # The same stamp again is not read again; a new one is, at its notification.
        await publish(client, snapshot(pod(1, 0.1, address="10.0.0.1:8000")))
        await put_cluster(client, encode_cluster(objects(1, 2)))
        await eventually(lambda: applied == [objects(1), objects(1, 2)])
        # A blob this reader cannot decode, then the hash gone: the last good set stays.
        await put_cluster(client, b'{"codec": 99}')
        await publish(client, snapshot(pod(2, 0.1, address="10.0.0.1:8000")))
        await eventually(lambda: version_of(source) is not None and version_of(source) >= 3)
        await client.delete(KEYS.cluster)
        await publish(client, snapshot(pod(3, 0.1, address="10.0.0.1:8000")))
        await eventually(lambda: version_of(source) == 4)
        assert source.cluster == objects(1, 2)
        assert applied == [objects(1), objects(1, 2)]
        # A late listener gets the current set at once.
        late: list[ClusterObjects] = []
        source.watch_cluster(late.append)
        assert late == [objects(1, 2)]


def test_the_static_source_hands_on_cluster_objects():
    source, applied = StaticSnapshotSource(), []
    source.set_cluster(objects(5))
    source.watch_cluster(applied.append)
    source.set_cluster(objects(6))
    assert applied == [objects(5), objects(6)]
