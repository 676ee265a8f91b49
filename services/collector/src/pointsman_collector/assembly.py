"""The collector's composition root: one collector, assembled from the config.

:func:`create_collector` builds the graph a ``pointsman-collector`` process runs: the target sources and
their union, the scrape loops and the publisher (:class:`~pointsman_collector.loop.Collector`), the Redis
sink (and the replicas' membership with ``collector.sharing``), the metrics and the HTTP surface. Every
I/O part can be passed in instead (the Redis client or the sink, the target sources, the scrapers, the
clock, the listening socket), so tests run the whole collector in-process. ``__main__`` parses arguments,
sets up logging and signals, runs the :class:`CollectorService` and maps failures to exit codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType

import uvicorn
from prometheus_client import CollectorRegistry
from redis.exceptions import RedisError

from pointsman_collector.app import create_app
from pointsman_collector.kubernetes import KubernetesTargets, from_kubeconfig, in_cluster
from pointsman_collector.loop import Clock, Collector
from pointsman_collector.metrics import ShareCollector
from pointsman_collector.scrape import Scraper
from pointsman_collector.sharing import Membership, ShardSink, Share
from pointsman_collector.sink import RedisSnapshotSink, SnapshotSink, redis_client
from pointsman_collector.targets import FileTargets, Sources, StaticTargets, TargetSource
from pointsman_shared.aio import wait_event
from pointsman_shared.config import PointsmanConfig, split_host_port
from pointsman_shared.keys import RedisKeys
from pointsman_shared.redis_client import RedisClient
from pointsman_shared.tracing import Tracing, build_tracing

log = logging.getLogger(__name__)

# uvicorn's own bound on draining open HTTP requests at shutdown.
HTTP_GRACE = 5
# How long the first sets of the sources (the first Kubernetes list) may take before scraping starts
# without them.
FIRST_DISCOVERY = 5.0


def create_collector(
    config: PointsmanConfig,
    *,
    registry: CollectorRegistry | None = None,
    redis: RedisClient | None = None,
    sink: SnapshotSink | None = None,
    targets: Sequence[TargetSource] | None = None,
    clock: Clock = time.time,
    scraper_factory: Callable[[str], Scraper] | None = None,
    listen: socket.socket | None = None,
    me: str | None = None,
    environ: Mapping[str, str] = os.environ,
    tracing: Tracing | None = None,
) -> CollectorService:
    """The collector ``config`` describes, not started yet.

    - ``registry``: where its metrics go (default: a fresh one, ``service.registry``);
    - ``redis``: the client for the sink and the membership; the caller closes it. Default: one for
      ``config.redis`` (one server, Sentinel's primary or a cluster), closed by
      :meth:`CollectorService.aclose`; none is made when ``sink`` is given and ``collector.sharing`` is
      off;
    - ``sink``: where snapshots go (default: Redis, merged with the other replicas' when sharing);
    - ``targets``: the sources of endpoints (default: :func:`config_targets` of ``config``, ``environ``);
    - ``clock``: wall-clock seconds, for update times and staleness;
    - ``scraper_factory``: one :class:`~pointsman_collector.scrape.Scraper` per pod address (default:
      the HTTP scraper, ``collector.timeout``, the config's metric names);
    - ``listen``: a bound listening socket the HTTP server takes over (default: ``collector.listen``,
      bound here; raises OSError when taken);
    - ``me``: this replica's name among the sharing replicas (default: ``hostname-pid``);
    - ``tracing``: the spans' provider (default: built from ``config.tracing``; none when it is off),
      shut down by :meth:`CollectorService.aclose`.

    Raises :class:`~pointsman_collector.errors.DiscoveryError` when a source cannot be set up (an
    unreadable kubeconfig, no service account).
    """
    registry = registry if registry is not None else CollectorRegistry()
    if tracing is None:
        tracing = build_tracing(config.tracing, "pointsman-collector", registry=registry)
    sources = list(targets) if targets is not None else config_targets(config, environ)
    keys = RedisKeys(config.pool.name)
    settings = config.collector
    owned_redis: RedisClient | None = None
    if redis is None and (sink is None or settings.sharing):
        redis = owned_redis = redis_client(config.redis.target)
    # A replica's name in the pool's member set: unique per process, readable in logs.
    me = me or f"{socket.gethostname()}-{os.getpid()}"
    if sink is None:
        assert redis is not None
        if settings.sharing:
            sink = ShardSink(redis, keys, me=me, ttl=settings.snapshot_ttl, staleness=settings.staleness)
        else:
            sink = RedisSnapshotSink(redis, keys, ttl=settings.snapshot_ttl)
    collector = Collector.from_config(
        config,
        sink=sink,
        registry=registry,
        scraper_factory=scraper_factory,
        clock=clock,
        tracer=tracing.tracer("pointsman_collector") if tracing is not None else None,
    )
    union = Sources()
    sharing: _Sharing | None = None
    if settings.sharing:
        assert redis is not None
        share = Share(me, collector.set_targets)
        membership = Membership(redis, keys, me=me, lease=settings.lease_ttl, on_members=share.set_members)
        sharing = _Sharing(share, membership)
        registry.register(
            ShareCollector(
                config.pool.name, owned=lambda: len(share.owned), replicas=lambda: len(share.members)
            )
        )
    else:
        registry.register(
            ShareCollector(config.pool.name, owned=lambda: len(union.endpoints), replicas=lambda: 1)
        )
    server = _Server(
        uvicorn.Config(
            create_app(collector, registry=registry),
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=HTTP_GRACE,
        )
    )
    if listen is None:
        listen = bind_listener(*split_host_port(settings.listen))
    return CollectorService(
        collector=collector,
        registry=registry,
        sources=sources,
        union=union,
        sharing=sharing,
        server=server,
        listen=listen,
        owned_redis=owned_redis,
        tracing=tracing,
    )


def config_targets(config: PointsmanConfig, environ: Mapping[str, str]) -> list[TargetSource]:
    """The sources ``config.pool`` names, in order: its list, its file, its InferencePool.

    Raises :class:`~pointsman_collector.errors.DiscoveryError` when the Kubernetes access cannot be read.
    """
    pool = config.pool
    sources: list[TargetSource] = [StaticTargets(pool.endpoints)]
    if pool.endpoints_file is not None:
        sources.append(FileTargets(pool.endpoints_file, static=(), default_port=pool.target_port))
    if pool.kubernetes is not None:
        k8s = pool.kubernetes
        if k8s.kubeconfig is not None:
            access = from_kubeconfig(k8s.kubeconfig, namespace=k8s.namespace)
        else:
            access = in_cluster(environ)
            if k8s.namespace is not None:
                access = dataclasses.replace(access, namespace=k8s.namespace)
        sources.append(
            KubernetesTargets(access, pool=k8s.inference_pool or pool.name, api_version=k8s.api_version)
        )
    return sources


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one). Raises OSError."""
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


@dataclasses.dataclass(frozen=True)
class _Sharing:
    share: Share
    membership: Membership


class CollectorService:
    """An assembled collector: :meth:`start` it (or ``async with``), :meth:`run` it until told to stop,
    :meth:`aclose` it. Made by :func:`create_collector`."""

    def __init__(
        self,
        *,
        collector: Collector,
        registry: CollectorRegistry,
        sources: Sequence[TargetSource],
        union: Sources,
        sharing: _Sharing | None,
        server: uvicorn.Server,
        listen: socket.socket,
        owned_redis: RedisClient | None,
        tracing: Tracing | None = None,
    ) -> None:
        self.collector = collector
        self.tracing = tracing
        self.registry = registry
        self._sources = sources
        self._union = union
        self._sharing = sharing
        self._server = server
        self._listen = listen
        self._owned_redis = owned_redis
        self._tasks: list[asyncio.Task[None]] = []  # the sources and the membership
        self._http: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def endpoints(self) -> tuple[str, ...]:
        """Every endpoint the sources name (with sharing, this replica scrapes its share of them)."""
        return self._union.endpoints

    @property
    def address(self) -> tuple[str, int]:
        """Where the HTTP surface listens: host and port (useful with port 0)."""
        host, port = self._listen.getsockname()[:2]
        return str(host), int(port)

    async def start(self) -> None:
        """Read the first endpoint sets (up to :data:`FIRST_DISCOVERY`), start scraping, publishing and
        serving HTTP. Closes everything again when it fails."""
        try:
            await self._discover()
            if self._sharing is not None:
                share, membership = self._sharing.share, self._sharing.membership
                with contextlib.suppress(RedisError, OSError):
                    share.set_members(await membership.renew())  # start with this replica's share, not all
                share.set_endpoints(self._union.endpoints)
                self.collector.start(share.owned)
                self._union.connect(share.set_endpoints)
                self._tasks.append(asyncio.create_task(membership.run(), name="membership"))
            else:
                self.collector.start(self._union.endpoints)
                self._union.connect(self.collector.set_targets)
            self._http = asyncio.create_task(self._server.serve(sockets=[self._listen]), name="http")
        except BaseException:
            await self.aclose()
            raise

    async def run(self, stop: asyncio.Event) -> str | None:
        """Serve until ``stop`` is set (then ``None``) or the HTTP server ends on its own (then why)."""
        if self._http is None:
            raise RuntimeError("the collector was not started")
        signalled = asyncio.create_task(stop.wait(), name="stop")
        try:
            await asyncio.wait([self._http, signalled], return_when=asyncio.FIRST_COMPLETED)
        finally:
            signalled.cancel()
        if stop.is_set():
            return None
        outcome = asyncio.CancelledError() if self._http.cancelled() else self._http.exception()
        return f"the HTTP server stopped on its own: {outcome!r}"

    async def aclose(self) -> None:
        """Stop in order: readiness goes false and the loops stop, then HTTP drains, then Redis closes."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.collector.stop()
        if self._http is not None:
            self._server.should_exit = True
            await asyncio.gather(self._http, return_exceptions=True)
        if self._owned_redis is not None:
            await self._owned_redis.aclose()
        self._listen.close()
        if self.tracing is not None:  # the spans still queued go out
            await asyncio.to_thread(self.tracing.shutdown)

    async def __aenter__(self) -> CollectorService:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _discover(self) -> None:
        """Start following every source; return once each has reported its first set, or on timeout."""
        firsts: list[asyncio.Event] = []
        for source in self._sources:
            self._union.update(source.name, ())  # the union keeps the sources' order, whoever answers first
        for source in self._sources:
            first = asyncio.Event()
            firsts.append(first)
            self._tasks.append(
                asyncio.create_task(self._follow(source, first), name=f"{source.name} discovery")
            )
        # Start with the pods the sources have, not an empty pool, when they answer soon.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FIRST_DISCOVERY
        for first in firsts:
            if not await wait_event(first, max(0.0, deadline - loop.time())):
                break

    async def _follow(self, source: TargetSource, first: asyncio.Event) -> None:
        def on_change(endpoints: tuple[str, ...]) -> None:
            self._union.update(source.name, endpoints)
            first.set()

        await source.follow(on_change)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The process's main() owns SIGINT and SIGTERM; uvicorn's handler would re-raise them after
        # shutdown.
        yield
