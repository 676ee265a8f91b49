"""The picker's Prometheus metrics, on a registry the app owns.

Every request metric is exported under two names fed by the same call: today's (``inference_model_*``,
the GIE endpoint picker's names before v1.0) and upstream's current ones (``inference_objective_*``,
from GIE v1.5.0's ``pkg/epp/metrics/metrics.go``), each with its own labels and buckets. Pool and
snapshot gauges are computed from the current snapshot at scrape time by a custom collector, so no stale
label series linger. docs/picker.md ("Metrics") lists every name.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from pointsman_picker.accesslog import LoggedResponse
from pointsman_picker.interfaces import SnapshotSource
from pointsman_picker.routing import Completion, Routing, Usage
from pointsman_picker.scheduling.contracts import RequestPlugin
from pointsman_picker.scheduling.prefix_cache import PrefixCacheProducer

# Upstream's buckets (GIE v1.5.0), its 32778 included.
SCHEDULER_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
DURATION_BUCKETS = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60,
    120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)  # fmt: skip
SIZE_BUCKETS = tuple(float(2**i) for i in range(6, 31))  # 64 B .. 1 GiB (request sizes)
RESPONSE_SIZE_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536)
INPUT_TOKEN_BUCKETS = (*RESPONSE_SIZE_BUCKETS, 131072, 262144, 524288, 1048576)
OUTPUT_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
# Today's names keep the buckets they always had: SIZE_BUCKETS for responses too, and these for tokens.
TOKEN_BUCKETS = tuple(float(2**i) for i in (0, *range(3, 21)))  # 1, 8 .. 1 Mi
# Upstream's error code for a response with an error status; today's names say ModelServer<status>.
MODEL_SERVER_ERROR = "ModelServerError"
# The (model, target) series an access log entry may add: its labels come from Envoy, not from this
# picker's own routing (another picker may have routed it), so they are bounded here.
MAX_LOGGED_SERIES = 4096
_MODEL_LABELS = ("model_name", "target_model_name")


class _Responses(NamedTuple):
    """The histogram children one (model, target) feeds as its responses end: today's, then upstream's."""

    duration: Histogram
    request_sizes: Histogram
    response_sizes: Histogram
    input_tokens: Histogram
    output_tokens: Histogram
    objective_duration: Histogram
    objective_request_sizes: Histogram
    objective_response_sizes: Histogram
    objective_input_tokens: Histogram
    objective_output_tokens: Histogram


class PickerMetrics:
    """One method per event (``routed``, ``failed``, ``finished``, ``completed``), each feeding both names.

    Label values are bounded (configured models, the passthrough labels the director caps, fixed results
    and codes), so each method caches the label children it needs by its arguments: an event costs one
    dict lookup and the increments.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

        def histogram(name: str, documentation: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, documentation, _MODEL_LABELS, buckets=buckets, registry=registry)

        self.requests = Counter(
            "inference_model_request",
            "Requests routed, by the model asked for and the model served.",
            _MODEL_LABELS,
            registry=registry,
        )
        self.objective_requests = Counter(
            "inference_objective_request",
            "Requests routed, by the model asked for, the model served and the objective's priority.",
            (*_MODEL_LABELS, "priority"),
            registry=registry,
        )
        self.request_errors = Counter(
            "inference_model_request_error",
            "Requests answered with an error, by model and upstream's error code.",
            (*_MODEL_LABELS, "error_code"),
            registry=registry,
        )
        self.objective_request_errors = Counter(
            "inference_objective_request_error",
            "Requests answered with an error, by model and upstream's error code.",
            (*_MODEL_LABELS, "error_code"),
            registry=registry,
        )
        self.running_requests = Gauge(
            "inference_objective_running_requests",
            "Requests routed whose ext_proc stream has not ended, by the model asked for.",
            ("model_name",),
            registry=registry,
        )
        self.scheduler_duration = Histogram(
            "inference_extension_scheduler_e2e_duration_seconds",
            "Time spent picking a pod.",
            buckets=SCHEDULER_BUCKETS,
            registry=registry,
        )
        self.decisions = Counter(
            "pointsman_picker_decisions",
            "Routing decisions by scheduling profile and result.",
            ("profile", "result"),
            registry=registry,
        )
        self.plugin_duration = Histogram(
            "inference_extension_plugin_duration_seconds",
            "Time one plugin of the scheduling profile took: a filter, scorer or picker "
            "(one decision in 16 is timed).",
            ("plugin_type", "plugin_name"),
            buckets=SCHEDULER_BUCKETS,
            registry=registry,
        )
        # Response side: only when Envoy sends responses to the picker (response_header_mode SEND).
        duration = "From request headers to the end of the response."
        request_sizes = "Request body bytes (as forwarded)."
        response_sizes = "Response body bytes."
        input_tokens = "Prompt tokens, from the response's usage."
        output_tokens = "Completion tokens, from the response's usage."
        self.request_duration = histogram(
            "inference_model_request_duration_seconds", duration, DURATION_BUCKETS
        )
        self.request_sizes = histogram("inference_model_request_sizes", request_sizes, SIZE_BUCKETS)
        self.response_sizes = histogram("inference_model_response_sizes", response_sizes, SIZE_BUCKETS)
        self.input_tokens = histogram("inference_model_input_tokens", input_tokens, TOKEN_BUCKETS)
        self.output_tokens = histogram("inference_model_output_tokens", output_tokens, TOKEN_BUCKETS)
        self.objective_duration = histogram(
            "inference_objective_request_duration_seconds", duration, DURATION_BUCKETS
        )
        self.objective_request_sizes = histogram(
            "inference_objective_request_sizes", request_sizes, SIZE_BUCKETS
        )
        self.objective_response_sizes = histogram(
            "inference_objective_response_sizes", response_sizes, RESPONSE_SIZE_BUCKETS
        )
        self.objective_input_tokens = histogram(
            "inference_objective_input_tokens", input_tokens, INPUT_TOKEN_BUCKETS
        )
        self.objective_output_tokens = histogram(
            "inference_objective_output_tokens", output_tokens, OUTPUT_TOKEN_BUCKETS
        )
        self.access_log_entries = Counter(
            "pointsman_picker_access_log_entries",
            "Envoy access log entries by result: recorded (response size and tokens), unrouted (no "
            "pointsman.route: its response was counted through ext_proc, or not routed), malformed, "
            "dropped (past a message's bounds).",
            ["result"],
            registry=registry,
        )
        # The label children's bound inc methods, by the arguments of routed and failed.
        self.config_reloads = Counter(
            "pointsman_picker_config_reloads",
            "Changes of the config file loaded while running, by result (applied, refused).",
            ["result"],
            registry=registry,
        )
        self.resolved = Counter(
            "pointsman_picker_resolved_requests",
            "Requests routed, by what decided them: the model entry or InferenceModelRewrite "
            "(config/NAME, cluster/NAME) and the InferenceObjective (config/NAME, cluster/NAME); "
            "empty for none.",
            ["rewrite", "objective"],
            registry=registry,
        )
        self.cluster_objects = Counter(
            "pointsman_picker_cluster_objects_applied",
            "New sets of cluster objects (InferenceObjectives, InferenceModelRewrites) read from Redis, "
            "by result (applied, refused).",
            ["result"],
            registry=registry,
        )
        self._decided: dict[tuple[str, str], Callable[[], None]] = {}
        self._routed: dict[tuple[str, str, int, str, str], tuple[Callable[[], None], ...]] = {}
        self._failed: dict[tuple[str, str, str, str, str], tuple[Callable[[], None], ...]] = {}
        self._running: dict[str, Gauge] = {}
        self._responses: dict[tuple[str, str], _Responses] = {}
        self._response_errors: dict[tuple[str, str, int], tuple[Counter, Counter]] = {}

    def routed(self, model: str, target: str, priority: int, profile: str, result: str) -> None:
        """A request got a destination; it runs until :meth:`finished` (a request without a model, ``""``,
        is not counted as running: upstream counts none without a model name)."""
        key = (model, target, priority, profile, result)
        increments = self._routed.get(key)
        if increments is None:
            children: list[Counter | Gauge] = [
                self.requests.labels(model, target),
                self.objective_requests.labels(model, target, str(priority)),
                self.decisions.labels(profile, result),
            ]
            if model:
                children.append(self._running_child(model))
            increments = self._routed[key] = tuple(child.inc for child in children)
        for increment in increments:
            increment()

    def finished(self, routing: Routing) -> None:
        """The ext_proc stream of a request :meth:`routed` counted has ended (however it ended)."""
        if routing.model:
            self._running_child(routing.model).dec()

    def _running_child(self, model: str) -> Gauge:
        child = self._running.get(model)
        if child is None:
            child = self._running[model] = self.running_requests.labels(model)
        return child

    def decided(self, rewrite: str, objective: str) -> None:
        increment = self._decided.get((rewrite, objective))
        if increment is None:
            increment = self._decided[rewrite, objective] = self.resolved.labels(rewrite, objective).inc
        increment()

    def cluster_applied(self, result: str) -> None:
        self.cluster_objects.labels(result).inc()

    def config_reload(self, result: str) -> None:
        self.config_reloads.labels(result).inc()

    def scheduled(self, seconds: float) -> None:
        self.scheduler_duration.observe(seconds)

    def failed(self, model: str, target: str, error_code: str, profile: str, result: str) -> None:
        """``model`` must be a configured model or "" (never raw client input: unbounded labels)."""
        key = (model, target, error_code, profile, result)
        increments = self._failed.get(key)
        if increments is None:
            increments = self._failed[key] = (
                self.request_errors.labels(model, target, error_code).inc,
                self.objective_request_errors.labels(model, target, error_code).inc,
                self.decisions.labels(profile, result).inc,
            )
        for increment in increments:
            increment()

    def plugins_timed(self, steps: list[tuple[str, str, int, float]]) -> None:
        for kind, name, _, seconds in steps:
            self.plugin_duration.labels(kind, name).observe(seconds)

    def completed(self, done: Completion) -> None:
        """A response Envoy showed the picker has ended; an HTTP error status counts as an error. As
        upstream, the ``inference_objective_*`` names leave out a duration that is not positive and
        token counts of zero."""
        key = (done.model, done.target)
        series = self._responses.get(key)
        if series is None:
            series = self._responses[key] = self._response_series(*key)
        if done.status >= 400:
            for child in self._errors_of(done.model, done.target, done.status):
                child.inc()
        series.duration.observe(done.duration)
        series.request_sizes.observe(done.request_bytes)
        series.objective_request_sizes.observe(done.request_bytes)
        if done.response_bytes is not None:
            series.response_sizes.observe(done.response_bytes)
            series.objective_response_sizes.observe(done.response_bytes)
        if done.duration > 0:
            series.objective_duration.observe(done.duration)
        if done.usage is not None:
            self._observe_usage(series, done.usage)

    def logged(self, done: LoggedResponse) -> bool:
        """Envoy's access log told the size and usage of a response whose ext_proc stream reported it
        without its body (:meth:`completed` counted its status and duration). False: not recorded, as
        its labels would pass :data:`MAX_LOGGED_SERIES`."""
        key = (done.model, done.target)
        series = self._responses.get(key)
        if series is None:
            if len(self._responses) >= MAX_LOGGED_SERIES:
                return False
            series = self._responses[key] = self._response_series(*key)
        series.response_sizes.observe(done.response_bytes)
        series.objective_response_sizes.observe(done.response_bytes)
        if done.usage is not None:
            self._observe_usage(series, done.usage)
        return True

    def access_log_result(self, result: str, entries: int) -> None:
        self.access_log_entries.labels(result).inc(entries)

    @staticmethod
    def _observe_usage(series: _Responses, usage: Usage) -> None:
        series.input_tokens.observe(usage.prompt_tokens)
        series.output_tokens.observe(usage.completion_tokens)
        if usage.prompt_tokens > 0:
            series.objective_input_tokens.observe(usage.prompt_tokens)
        if usage.completion_tokens > 0:
            series.objective_output_tokens.observe(usage.completion_tokens)

    def _response_series(self, model: str, target: str) -> _Responses:
        return _Responses(
            *(
                family.labels(model, target)
                for family in (
                    self.request_duration,
                    self.request_sizes,
                    self.response_sizes,
                    self.input_tokens,
                    self.output_tokens,
                    self.objective_duration,
                    self.objective_request_sizes,
                    self.objective_response_sizes,
                    self.objective_input_tokens,
                    self.objective_output_tokens,
                )
            )
        )

    def _errors_of(self, model: str, target: str, status: int) -> tuple[Counter, Counter]:
        key = (model, target, status)
        children = self._response_errors.get(key)
        if children is None:
            children = self._response_errors[key] = (
                self.request_errors.labels(model, target, f"ModelServer{status}"),
                self.objective_request_errors.labels(model, target, MODEL_SERVER_ERROR),
            )
        return children


class SnapshotCollector(Collector):
    """Gauges of the snapshot the picker currently routes with (upstream's pool gauges among them)."""

    def __init__(self, source: SnapshotSource, pool: str, clock: Callable[[], float]) -> None:
        self._source = source
        self._pool = pool
        self._clock = clock

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        snapshot = self._source.current()
        present = GaugeMetricFamily(
            "pointsman_picker_snapshot_present", "1 while the picker holds a pool snapshot.", labels=["name"]
        )
        present.add_metric([self._pool], 1.0 if snapshot is not None else 0.0)
        yield present
        if snapshot is None:
            return
        yield _gauge(
            "pointsman_picker_snapshot_version",
            "Version of the snapshot in use.",
            self._pool,
            snapshot.version,
        )
        yield _gauge(
            "pointsman_picker_snapshot_age_seconds",
            "Seconds since the snapshot in use was published.",
            self._pool,
            max(0.0, self._clock() - snapshot.published_at),
        )
        # Upstream's per-pod queue names the pod by its Kubernetes name; a snapshot knows its address.
        per_pod = GaugeMetricFamily(
            "inference_pool_per_pod_queue_size",
            "Requests waiting on each pod of the pool (every pod of the snapshot, healthy or not).",
            labels=["name", "model_server_pod"],
        )
        for pod in snapshot.pods:
            per_pod.add_metric([self._pool, pod.address], pod.waiting)
        yield per_pod
        pods = [pod for pod in snapshot.pods if pod.healthy]
        yield _gauge("inference_pool_ready_pods", "Healthy pods in the pool.", self._pool, len(pods))
        if pods:
            yield _gauge(
                "inference_pool_average_kv_cache_utilization",
                "Mean KV-cache use of the healthy pods.",
                self._pool,
                sum(pod.kv_cache_usage for pod in pods) / len(pods),
            )
            yield _gauge(
                "inference_pool_average_queue_size",
                "Mean waiting queue of the healthy pods.",
                self._pool,
                sum(pod.waiting for pod in pods) / len(pods),
            )
            yield _gauge(
                "inference_pool_average_running_requests",
                "Mean running requests of the healthy pods.",
                self._pool,
                sum(pod.running for pod in pods) / len(pods),
            )


class RuntimeCollector(Collector):
    """What the picker holds open, read at scrape time: ext_proc streams and its event loop's tasks. A
    leak of either shows as growth under steady load (``make soak`` watches both)."""

    def __init__(self, *, open_streams: Callable[[], int], tasks: Callable[[], int] | None = None) -> None:
        self._open_streams = open_streams
        self._tasks = tasks or loop_tasks

    def describe(self) -> Iterator[Metric]:
        return self.collect()

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "pointsman_picker_open_streams",
            "ext_proc streams open now (each request Envoy has the picker process, until its stream ends).",
            value=self._open_streams(),
        )
        yield GaugeMetricFamily(
            "pointsman_picker_event_loop_tasks",
            "asyncio tasks of the picker's event loop not done yet.",
            value=self._tasks(),
        )


def loop_tasks() -> int:
    """Tasks not done yet in the running event loop; 0 outside one (a scrape from another thread)."""
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:
        return 0


def _gauge(name: str, documentation: str, pool: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=["name"])
    family.add_metric([pool], value)
    return family


class MetricsServer:
    """A minimal asyncio HTTP server for ``GET /metrics``: no thread, stops at once."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._handle, host or None, port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                request_line = await reader.readline()
                while await reader.readline() not in (b"\r\n", b"\n", b""):
                    pass
            parts = request_line.decode("latin-1").split()
            path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
            if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
                status, content_type, payload = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif path in ("/metrics", "/"):
                status, content_type, payload = "200 OK", CONTENT_TYPE_LATEST, generate_latest(self._registry)
            else:
                status, content_type, payload = "404 Not Found", "text/plain", b"see /metrics\n"
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode("latin-1") + (b"" if parts[:1] == ["HEAD"] else payload))
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


class PrefixSyncState(Protocol):
    """What :class:`PrefixIndexCollector` reads of the prefix index's Redis side."""

    failures: int
    published: int
    learnt: int


class PrefixIndexCollector(Collector):
    """The prefix-cache index of the running profile, read at scrape time: its size (upstream's
    ``inference_extension_prefix_indexer_size``), the blocks waiting to be announced, and the Redis
    sync's counts (absent when the index is not shared)."""

    def __init__(
        self, plugins: Callable[[], Iterable[RequestPlugin]], sync: Callable[[], PrefixSyncState | None]
    ) -> None:
        self._plugins = plugins
        self._sync = sync

    def describe(self) -> Iterator[Metric]:
        return self.collect()

    def collect(self) -> Iterator[Metric]:
        producers = [p for p in self._plugins() if isinstance(p, PrefixCacheProducer)]
        yield GaugeMetricFamily(
            "inference_extension_prefix_indexer_size",
            "(block, pod) entries of the prefix-cache index.",
            value=sum(len(p.index) for p in producers),
        )
        yield GaugeMetricFamily(
            "pointsman_picker_prefix_outbox_blocks",
            "Blocks recorded by this picker and not yet announced to the others (waiting for Redis).",
            value=sum(p.outbox() for p in producers),
        )
        sync = self._sync()
        if sync is None:
            return
        yield CounterMetricFamily(
            "pointsman_picker_prefix_sync_entries_published",
            "Stream entries this picker appended to the shared prefix index.",
            value=sync.published,
        )
        yield CounterMetricFamily(
            "pointsman_picker_prefix_sync_announcements_learnt",
            "Other pickers' announcements (one pod's blocks each) applied to this picker's index.",
            value=sync.learnt,
        )
        yield GaugeMetricFamily(
            "pointsman_picker_prefix_sync_failures",
            "Sync rounds failed in a row (0 while Redis answers): the picker routes by its own index.",
            value=sync.failures,
        )
