"""The picker's Prometheus metrics, on a registry the app owns.

Request metrics keep upstream's names and labels (spec §6). Pool and snapshot gauges are computed from
the current snapshot at scrape time by a custom collector, so no stale label series linger.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from pointsman_picker.ports import SnapshotSource
from pointsman_picker.routing import Completion

# Upstream's buckets.
SCHEDULER_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
DURATION_BUCKETS = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60,
    120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)  # fmt: skip
SIZE_BUCKETS = tuple(float(2**i) for i in range(6, 31))  # 64 B .. 1 GiB
TOKEN_BUCKETS = tuple(float(2**i) for i in (0, *range(3, 21)))  # 1, 8 .. 1 Mi
_MODEL_LABELS = ["model_name", "target_model_name"]


class PickerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "inference_model_request",
            "Requests routed, by the model asked for and the model served.",
            ["model_name", "target_model_name"],
            registry=registry,
        )
        self.request_errors = Counter(
            "inference_model_request_error",
            "Requests answered with an error, by model and upstream's error code.",
            ["model_name", "target_model_name", "error_code"],
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
            ["profile", "result"],
            registry=registry,
        )
        # Response side: only when Envoy sends responses to the picker (response_header_mode SEND).
        self.request_duration = Histogram(
            "inference_model_request_duration_seconds",
            "From request headers to the end of the response.",
            _MODEL_LABELS,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.request_sizes = Histogram(
            "inference_model_request_sizes",
            "Request body bytes (as forwarded).",
            _MODEL_LABELS,
            buckets=SIZE_BUCKETS,
            registry=registry,
        )
        self.response_sizes = Histogram(
            "inference_model_response_sizes",
            "Response body bytes.",
            _MODEL_LABELS,
            buckets=SIZE_BUCKETS,
            registry=registry,
        )
        self.input_tokens = Histogram(
            "inference_model_input_tokens",
            "Prompt tokens, from the response's usage.",
            _MODEL_LABELS,
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self.output_tokens = Histogram(
            "inference_model_output_tokens",
            "Completion tokens, from the response's usage.",
            _MODEL_LABELS,
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self.plugin_duration = Histogram(
            "inference_extension_plugin_duration_seconds",
            "Time one filter of the scheduling tree took (one decision in 16 is timed).",
            ["plugin_type", "plugin_name"],
            buckets=SCHEDULER_BUCKETS,
            registry=registry,
        )
        self._routed: dict[tuple[str, str, str, str], tuple[Counter, Counter]] = {}

    def routed(self, model: str, target: str, profile: str, result: str) -> None:
        # Label values here are bounded (configured models, fixed results): cache the children.
        key = (model, target, profile, result)
        children = self._routed.get(key)
        if children is None:
            children = self._routed[key] = (
                self.requests.labels(model, target),
                self.decisions.labels(profile, result),
            )
        children[0].inc()
        children[1].inc()

    def scheduled(self, seconds: float) -> None:
        self.scheduler_duration.observe(seconds)

    def failed(self, model: str, target: str, error_code: str, profile: str, result: str) -> None:
        """``model`` must be a configured model or "" (never raw client input: unbounded labels)."""
        self.request_errors.labels(model, target, error_code).inc()
        self.decisions.labels(profile, result).inc()

    def filters_timed(self, steps: list[tuple[str, int, float]]) -> None:
        for name, _, seconds in steps:
            self.plugin_duration.labels("filter", name).observe(seconds)

    def completed(self, done: Completion) -> None:
        """A response Envoy showed the picker has ended; an HTTP error status counts as an error."""
        labels = (done.model, done.target)
        if done.status >= 400:
            self.request_errors.labels(*labels, f"ModelServer{done.status}").inc()
        self.request_duration.labels(*labels).observe(done.duration)
        self.request_sizes.labels(*labels).observe(done.request_bytes)
        self.response_sizes.labels(*labels).observe(done.response_bytes)
        if done.usage is not None:
            self.input_tokens.labels(*labels).observe(done.usage.prompt_tokens)
            self.output_tokens.labels(*labels).observe(done.usage.completion_tokens)


class SnapshotCollector(Collector):
    """Gauges of the snapshot the picker currently routes with."""

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
