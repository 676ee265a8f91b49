"""``pointsman-collector --config FILE``: scrape the pool's pods and publish them to Redis until signalled."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterator, Sequence

import uvicorn
from prometheus_client import CollectorRegistry
from redis.exceptions import RedisError

from pointsman_collector.app import create_app
from pointsman_collector.errors import DiscoveryError
from pointsman_collector.kubernetes import KubernetesTargets, from_kubeconfig, in_cluster
from pointsman_collector.loop import Collector
from pointsman_collector.metrics import ShareCollector
from pointsman_collector.sharing import Membership, ShardSink, Share
from pointsman_collector.sink import RedisSnapshotSink, SnapshotSink, redis_client
from pointsman_collector.targets import FileTargets, Sources
from pointsman_shared import aio
from pointsman_shared.aio import wait_event
from pointsman_shared.config import ConfigError, PointsmanConfig, load_config, split_host_port
from pointsman_shared.keys import RedisKeys

log = logging.getLogger("pointsman_collector")

# uvicorn's own bound on draining open HTTP requests at shutdown.
HTTP_GRACE = 5
# How long the first Kubernetes list may take before scraping starts without its pods.
FIRST_DISCOVERY = 5.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pointsman-collector", description=__doc__)
    parser.add_argument("--config", help="the Pointsman config file (default: $POINTSMAN_CONFIG)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    path = args.config or os.environ.get("POINTSMAN_CONFIG")
    if not path:
        parser.error("--config is required when POINTSMAN_CONFIG is not set")
    try:
        config = load_config(path, environ=os.environ)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # What is loaded by now lives as long as the process. Frozen, it is left out of the full garbage
    # collections that the scrapes' many short-lived objects set off: each walked all of it, pausing the
    # loop for up to 45 ms (late rounds, old metrics) at 200 pods; now a few ms.
    gc.freeze()
    return aio.run(serve(config))


async def serve(config: PointsmanConfig) -> int:
    """Run until SIGINT or SIGTERM; return the process exit code."""
    host, port = split_host_port(config.collector.listen)
    try:
        # Bound before anything starts, so a taken port fails fast and plainly.
        sock = _bind(host, port)
    except OSError as exc:
        log.error("cannot listen on %s: %s", config.collector.listen, exc.strerror or exc)
        return 1
    registry = CollectorRegistry()
    keys = RedisKeys(config.pool.name)
    client = redis_client(config.redis.url)
    # A replica's name in the pool's member set: unique per process, readable in logs.
    me = f"{socket.gethostname()}-{os.getpid()}"
    sink: SnapshotSink
    if config.collector.sharing:
        sink = ShardSink(client, keys, me=me, ttl=config.collector.snapshot_ttl)
    else:
        sink = RedisSnapshotSink(client, keys, ttl=config.collector.snapshot_ttl)
    collector = Collector.from_config(config, sink=sink, registry=registry)
    server = _Server(
        uvicorn.Config(
            create_app(collector, registry=registry),
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=HTTP_GRACE,
        )
    )
    sources = Sources()
    try:
        discovery = await _start_discovery(config, sources)
    except DiscoveryError as exc:
        log.error("cannot discover pods: %s", exc.detail)
        sock.close()
        await client.aclose()
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "collecting pool %s: %d pods every %.0f ms, publishing to %s, listening on %s",
        config.pool.name,
        len(sources.endpoints),
        config.collector.interval * 1000,
        _redacted(config.redis.url),
        config.collector.listen,
    )
    if config.collector.sharing:
        share = Share(me, collector.set_targets)
        membership = Membership(
            client, keys, me=me, lease=config.collector.lease_ttl, on_members=share.set_members
        )
        with contextlib.suppress(RedisError, OSError):
            share.set_members(await membership.renew())  # start with this replica's share, not all pods
        share.set_endpoints(sources.endpoints)
        collector.start(share.owned)
        sources.connect(share.set_endpoints)
        discovery.append(asyncio.create_task(membership.run(), name="membership"))
        registry.register(
            ShareCollector(
                config.pool.name, owned=lambda: len(share.owned), replicas=lambda: len(share.members)
            )
        )
    else:
        collector.start(sources.endpoints)
        sources.connect(collector.set_targets)
        registry.register(
            ShareCollector(config.pool.name, owned=lambda: len(sources.endpoints), replicas=lambda: 1)
        )
    http = asyncio.create_task(server.serve(sockets=[sock]), name="http")
    signalled = asyncio.create_task(stop.wait(), name="signal")
    try:
        await asyncio.wait([http, signalled], return_when=asyncio.FIRST_COMPLETED)
    finally:
        log.info("shutting down")
        # Readiness goes false and the loops stop, then HTTP drains, then Redis closes.
        signalled.cancel()
        for task in discovery:
            task.cancel()
        await asyncio.gather(*discovery, return_exceptions=True)
        await collector.stop()
        server.should_exit = True
        (http_outcome,) = await asyncio.gather(http, return_exceptions=True)
        await client.aclose()
        sock.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    if not stop.is_set():
        log.error("the HTTP server stopped on its own: %r", http_outcome)
        return 1
    log.info("stopped")
    return 0


async def _start_discovery(config: PointsmanConfig, sources: Sources) -> list[asyncio.Task[None]]:
    """Fill ``sources`` with the first endpoint sets and start the tasks that keep them current."""
    pool = config.pool
    sources.update("config", pool.endpoints)
    tasks: list[asyncio.Task[None]] = []
    if pool.endpoints_file is not None:
        file = FileTargets(
            pool.endpoints_file,
            static=(),
            default_port=pool.target_port,
            on_change=functools.partial(sources.update, "file"),
        )
        file.refresh()
        sources.update("file", file.endpoints)
        tasks.append(asyncio.create_task(file.watch(), name="endpoints file"))
    if pool.kubernetes is not None:
        k8s = pool.kubernetes
        if k8s.kubeconfig is not None:
            access = from_kubeconfig(k8s.kubeconfig, namespace=k8s.namespace)
        else:
            access = in_cluster(os.environ)
            if k8s.namespace is not None:
                access = dataclasses.replace(access, namespace=k8s.namespace)
        cluster = KubernetesTargets(
            access,
            pool=k8s.inference_pool or pool.name,
            api_version=k8s.api_version,
            on_change=functools.partial(sources.update, "kubernetes"),
        )
        tasks.append(asyncio.create_task(cluster.run(), name="kubernetes discovery"))
        # Start with the pods the cluster has, not an empty pool, when the API answers soon.
        await wait_event(cluster.synced, FIRST_DISCOVERY)
    return tasks


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # serve() owns SIGINT and SIGTERM; uvicorn's handler would re-raise them after shutdown.
        yield


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _redacted(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    credentials, at, location = rest.rpartition("@")
    return f"{scheme}{sep}***@{location}" if at and credentials else url


if __name__ == "__main__":
    sys.exit(main())
