"""Assemble the picker from a config and run it: ext_proc + health on ``picker.listen``, health alone on
``picker.healthListen``, Prometheus on ``picker.metricsListen``.

Shutdown is ordered and bounded: health NOT_SERVING, stop accepting, let open streams finish within the
grace period, cancel the rest, then stop the metrics server and the snapshot source.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import random
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import orjson
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from grpc_health.v1 import health, health_pb2_grpc
from prometheus_client import CollectorRegistry

from pointsman_picker.accesslog import AccessLogService, GrpcioAccessLogServicer, access_log_methods
from pointsman_picker.director import Director
from pointsman_picker.errors import PickerError
from pointsman_picker.extproc.servicer import ExtProcService, GrpcioServicer, native_methods
from pointsman_picker.extproc.stream import StreamSettings
from pointsman_picker.flowcontrol.controller import FlowController
from pointsman_picker.flowgate import FlowGate
from pointsman_picker.flowmetrics import FlowCollector, FlowControlMetrics
from pointsman_picker.h2grpc.config import Http2Config
from pointsman_picker.h2grpc.server import GrpcServer
from pointsman_picker.health import HealthBoard, health_methods
from pointsman_picker.metrics import (
    MetricsServer,
    PickerMetrics,
    PrefixIndexCollector,
    RuntimeCollector,
    SnapshotCollector,
)
from pointsman_picker.peer_sync import RedisPeerSync
from pointsman_picker.prefix_sync import RedisPrefixSync
from pointsman_picker.reload import ConfigWatcher
from pointsman_picker.routing import Routing
from pointsman_picker.scheduling.profiles import build_profile
from pointsman_picker.scheduling.registry import PluginError
from pointsman_picker.snapshots import RedisSnapshotSource, SnapshotFeed
from pointsman_picker.tracing import RouteTracer
from pointsman_shared import upstream
from pointsman_shared.cluster import ClusterObjects
from pointsman_shared.config import ConfigError, PointsmanConfig
from pointsman_shared.keys import RedisKeys
from pointsman_shared.tracing import Tracing, build_tracing

log = logging.getLogger(__name__)

# How often the picker looks for a fresh snapshot before it turns ready.
READY_POLL = 0.05
DEFAULT_GRACE = 5.0
# Without this, gRPC sets SO_REUSEPORT and a second picker could silently share the port.
_SERVER_OPTIONS = [("grpc.so_reuseport", 0)]


def split_listen(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` (port 0 allowed, for tests)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class PickerApp:
    def __init__(
        self,
        config: PointsmanConfig,
        *,
        source: SnapshotFeed,
        registry: CollectorRegistry,
        rng: random.Random,
        clock: Callable[[], float],
        tracing: Tracing | None = None,
        share: bool = False,
    ) -> None:
        """``share``: the prefix-cache index (:mod:`~pointsman_picker.prefix_sync`) and, with flow
        control, the dispatches (:mod:`~pointsman_picker.peer_sync`) are shared with the other pickers
        through the config's Redis."""
        self.config = config
        self.source = source
        self.registry = registry
        self.tracing = tracing
        self.metrics = PickerMetrics(registry)
        registry.register(SnapshotCollector(source, config.pool.name, clock))
        self.director = Director(config, source, self.metrics, rng=rng, clock=clock, timer=time.perf_counter)
        # Flow control (off by default): requests wait in the picker while the pool is saturated.
        self.flow: FlowGate | None = None
        # Active-active: the flow controllers count each other's dispatches through Redis.
        self.peer_sync: RedisPeerSync | None = None
        if config.flow_control.enabled:
            flow_metrics = FlowControlMetrics(registry)
            peers = None
            if share:
                self.peer_sync = RedisPeerSync(
                    config.redis.target,
                    RedisKeys(config.pool.name),
                    lambda: self.flow.controller if self.flow is not None else None,
                    source,
                    horizon=config.picker.max_staleness,
                    clock=clock,
                )
                peers = self.peer_sync.extra
            controller = FlowController(self.director, config, clock=clock, metrics=flow_metrics, peers=peers)
            registry.register(FlowCollector(controller, flow_metrics.flows, config.pool.name))
            self.flow = FlowGate(controller)
        source.watch_cluster(self.apply_cluster)
        self.service = ExtProcService(
            self.flow.route if self.flow is not None else self.director.route,
            stream_settings(config),
            on_error=self._record_error,
            on_complete=self.metrics.completed,
            on_finish=self._finished,
            clock=time.monotonic,
            on_response=self.flow.responded if self.flow is not None else None,
            tracer=self._route_tracer(tracing, clock),
        )
        # Envoy's access log: response sizes and tokens of the responses whose body it did not show.
        self.access_log = AccessLogService(
            on_logged=self.metrics.logged, on_result=self.metrics.access_log_result
        )
        registry.register(RuntimeCollector(open_streams=lambda: self.service.open_streams))
        self.prefix_sync = (
            RedisPrefixSync(
                config.redis.target, RedisKeys(config.pool.name), self.director.request_plugins, clock=clock
            )
            if share
            else None
        )
        registry.register(PrefixIndexCollector(self.director.request_plugins, lambda: self.prefix_sync))
        self.health = HealthBoard()
        # grpc.aio's servicer (the health port; ext_proc's port with picker.server grpcio) keeps a copy.
        self._grpc_health = health.aio.HealthServicer()
        self._clock = clock
        self.port = 0
        self.health_port = 0
        self.metrics_port = 0
        self._server: grpc.aio.Server | None = None
        self._native: GrpcServer | None = None
        self._health_server: grpc.aio.Server | None = None
        self._metrics_server: MetricsServer | None = None
        self._ready_task: asyncio.Task[None] | None = None

    def reconfigure(self, config: PointsmanConfig) -> None:
        """Swap in a changed config between two requests (open streams finish with the settings they
        started with). Addresses, Redis and the pool name are read at start only."""
        for what, old, new in _restart_only(self.config, config):
            log.warning("config: %s changed (%s -> %s); it takes effect after a restart", what, old, new)
        self.director.reconfigure(config)
        if self.flow is not None:
            self.flow.controller.reconfigure(config)
        self.service.settings = stream_settings(config)
        self.config = config
        log.info("config reloaded: %d models", len(config.models))

    def apply_cluster(self, objects: ClusterObjects) -> None:
        """Resolve with the cluster's new objectives and rewrites from the next request on (as a config
        reload is applied); ignored with ``picker.clusterObjects: config``."""
        try:
            self.director.apply_cluster(objects)
        except Exception:  # a bug here must not stop the snapshot reads that called it
            log.exception("cluster objects not applied; the last set stays")
            self.metrics.cluster_applied("refused")
            return
        self.metrics.cluster_applied("applied")
        if self.config.picker.cluster_objects != "config":
            log.info(
                "cluster objects applied: %d objectives, %d rewrites",
                len(objects.objectives),
                len(objects.rewrites),
            )

    def _route_tracer(self, tracing: Tracing | None, clock: Callable[[], float]) -> RouteTracer | None:
        if tracing is None:
            return None

        def snapshot_age() -> float | None:
            snapshot = self.source.current()
            return None if snapshot is None else clock() - snapshot.published_at

        return RouteTracer(
            tracing.tracer("pointsman_picker"),
            profile=lambda: self.director.profile,
            snapshot_age=snapshot_age,
            objective_header=lambda: self.service.settings.objective_header,
            parent_based=tracing.config.sampler.startswith("parentbased_"),
        )

    def _finished(self, routing: Routing) -> None:
        """A routed request's stream ended: its assignment is over, and it no longer runs."""
        self.director.release(routing)
        self.metrics.finished(routing)
        if self.flow is not None:
            self.flow.finished(routing)

    def _record_error(self, error: PickerError) -> None:
        self.metrics.failed(error.model, error.target, error.code, self.director.profile, error.result)

    async def start(self) -> None:
        picker = self.config.picker
        await self._sync_health()
        await self.source.start()
        if self.prefix_sync is not None:
            await self.prefix_sync.start()
        if self.peer_sync is not None:
            await self.peer_sync.start()
        if self.flow is not None:
            self.flow.start()

        if picker.server == "native":
            self._native = GrpcServer(
                {
                    **native_methods(self.service),
                    **health_methods(self.health),
                    **access_log_methods(self.access_log),
                },
                # The body plus the ProcessingRequest around it.
                max_message_bytes=picker.max_body_bytes + 64 * 1024,
                http2=Http2Config.of(picker.http2),  # checked when the config was loaded
            )
            self.port = await self._native.start(*split_listen(picker.listen))
        else:
            self._server = grpc.aio.server(options=_SERVER_OPTIONS)
            external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(
                GrpcioServicer(self.service), self._server
            )
            health_pb2_grpc.add_HealthServicer_to_server(self._grpc_health, self._server)
            self._server.add_generic_rpc_handlers((GrpcioAccessLogServicer(self.access_log).handler(),))
            self.port = self._server.add_insecure_port(picker.listen)
            await self._server.start()
        self._health_server = grpc.aio.server(options=_SERVER_OPTIONS)
        health_pb2_grpc.add_HealthServicer_to_server(self._grpc_health, self._health_server)
        self.health_port = self._health_server.add_insecure_port(picker.health_listen)
        await self._health_server.start()

        self._metrics_server = MetricsServer(self.registry)
        await self._metrics_server.start(*split_listen(picker.metrics_listen))
        self.metrics_port = self._metrics_server.port
        self.health.live()
        await self._sync_health()
        self._ready_task = asyncio.create_task(self._serve_when_ready(), name="health-ready")
        log.info(
            "picker for pool %s: ext_proc (%s server) on port %d, health on %d, metrics on %d",
            self.config.pool.name,
            picker.server,
            self.port,
            self.health_port,
            self.metrics_port,
        )

    async def _serve_when_ready(self) -> None:
        await self.source.wait_ready()
        while True:  # polled: readiness waits for a snapshot that is fresh, not for one to arrive
            snapshot = self.director.fresh_snapshot(self._clock())
            if snapshot is not None:
                break
            await asyncio.sleep(READY_POLL)
        self.health.ready()
        await self._sync_health()
        log.info("first fresh snapshot (version %d): ready", snapshot.version)

    async def _sync_health(self) -> None:
        for service, status in self.health.items():
            await self._grpc_health.set(service, status)

    async def stop(self, grace: float = DEFAULT_GRACE) -> None:
        self.health.shut_down()
        await self._grpc_health.enter_graceful_shutdown()  # NOT_SERVING there, and later sets are ignored
        if self._ready_task is not None:
            self._ready_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ready_task
        if self.flow is not None:
            # Before the servers stop: every waiting request gets its answer (503) while they can send.
            await self.flow.drain()
        if self._server is not None or self._native is not None:
            log.info("stopping: %d open streams, grace %.1fs", self.service.open_streams, grace)
            self.service.shutting_down(grace)
            # Envoy never ends its access log streams: end them, or they would hold the grace.
            self.access_log.shutting_down()
            if self._server is not None:
                await self._server.stop(grace)
            if self._native is not None:
                await self._native.stop(grace)
            # Only the streams still open when the grace ran out (not every stream Envoy reset).
            log.info("ext_proc server stopped (%d streams cut short)", self.service.unfinished_streams)
        if self._health_server is not None:
            await self._health_server.stop(None)
        if self._metrics_server is not None:
            await self._metrics_server.stop()
        if self.prefix_sync is not None:
            await self.prefix_sync.aclose()
        if self.peer_sync is not None:
            await self.peer_sync.aclose()
        await self.source.aclose()
        if self.tracing is not None:  # the spans still queued go out (within tracing.exportTimeout)
            await asyncio.to_thread(self.tracing.shutdown)


def checked(config: PointsmanConfig, source: str = "<config>") -> PointsmanConfig:
    """``config``, once its plugins and profiles build and ``picker.http2`` is valid; else
    :class:`ConfigError` naming the bad path."""
    try:
        build_profile(config)
    except PluginError as exc:
        raise ConfigError(source, [(exc.path, exc.message)]) from None
    Http2Config.of(config.picker.http2, source)
    return config


def load_checked(path: Path, extra: Mapping[str, Any] | None = None) -> tuple[PointsmanConfig, list[str]]:
    """The config in ``path`` with the command line's ``extra`` fields, checked; and the warnings of
    an upstream EndpointPickerConfig's translation."""
    config, warnings = upstream.load(path, extra=extra or {}, environ=os.environ)
    return checked(config, str(path)), warnings


def stream_settings(config: PointsmanConfig) -> StreamSettings:
    picker = config.picker
    return StreamSettings(
        picker.max_body_bytes,
        picker.destination_header,
        picker.metadata_namespace,
        picker.explain_header.lower() if picker.explain_header else None,
        picker.objective_header.lower(),
        models_listing(config),
        config.flow_control.max_message_timeout,
    )


def models_listing(config: PointsmanConfig) -> bytes | None:
    """GET /v1/models as OpenAI answers it, listing the names clients send (the configured models', not
    their targets'); ``None`` without configured models: then a pod lists what it serves."""
    if not config.models:
        return None
    data = [
        {"id": m.model_name, "object": "model", "created": 0, "owned_by": "pointsman"} for m in config.models
    ]
    return orjson.dumps({"object": "list", "data": data})


def _restart_only(old: PointsmanConfig, new: PointsmanConfig) -> list[tuple[str, object, object]]:
    pairs = [
        ("picker.listen", old.picker.listen, new.picker.listen),
        ("picker.healthListen", old.picker.health_listen, new.picker.health_listen),
        ("picker.metricsListen", old.picker.metrics_listen, new.picker.metrics_listen),
        ("picker.server", old.picker.server, new.picker.server),
        ("picker.http2", Http2Config.of(old.picker.http2), Http2Config.of(new.picker.http2)),
        ("redis", old.redis.display, new.redis.display),
        ("pool.name", old.pool.name, new.pool.name),
        ("flowControl.enabled", old.flow_control.enabled, new.flow_control.enabled),
        ("tracing", old.tracing, new.tracing),
    ]
    return [(what, a, b) for what, a, b in pairs if a != b]


def create_app(
    config: PointsmanConfig,
    *,
    source: SnapshotFeed | None = None,
    registry: CollectorRegistry | None = None,
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.time,
    tracing: Tracing | None = None,
    share: bool | None = None,
) -> PickerApp:
    """The picker, its parts built from ``config`` where not given (``tracing``: from
    ``config.tracing``, none when it is off); the prefix index and flow control's dispatches are
    shared through Redis when the snapshots come from Redis too (``share`` unset and no ``source``
    given)."""
    registry = registry if registry is not None else CollectorRegistry()
    if tracing is None:
        tracing = build_tracing(config.tracing, "pointsman-picker", registry=registry)
    return PickerApp(
        config,
        source=source or RedisSnapshotSource(config.redis.target, RedisKeys(config.pool.name)),
        registry=registry,
        rng=rng or random.Random(),
        clock=clock,
        tracing=tracing,
        share=source is None if share is None else share,
    )


async def serve(
    config: PointsmanConfig,
    *,
    config_path: Path | None = None,
    load: Callable[[Path], tuple[PointsmanConfig, list[str]]] = load_checked,
    grace: float = DEFAULT_GRACE,
) -> int:
    """Run until SIGINT or SIGTERM, watching ``config_path`` for changes (read with ``load``); the exit
    status."""
    app = create_app(config)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    try:
        await app.start()
    except (RuntimeError, OSError) as exc:
        log.error("cannot start: %s", exc)
        await app.stop(0)
        return 1
    # What start-up built lives as long as the process: keep full collections from walking it on
    # every pass (a full collection of the started picker took 36 ms, a latency spike per pass).
    gc.freeze()
    watch: asyncio.Task[None] | None = None
    if config_path is not None:
        watcher = ConfigWatcher(config_path, load, app.reconfigure, on_result=app.metrics.config_reload)
        watch = asyncio.create_task(watcher.run(), name="config")
    await stopping.wait()
    log.info("signal received, shutting down")
    if watch is not None:
        watch.cancel()
    await app.stop(grace)
    return 0
