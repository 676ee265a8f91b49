"""OpenTelemetry for every service: a tracer provider exporting over OTLP, built once in ``main()`` from
the config's ``tracing`` section, and W3C trace-context helpers.

An edge module (the pure core may not import opentelemetry: an import-linter contract holds it). With
tracing off, :func:`build_tracing` returns ``None`` and the services build no SDK object at all, so the
hot path pays one ``is None`` test.

The export never holds up a request: ended spans go into a bounded queue that a background thread
drains in batches; a span that finds the queue full is dropped. What became of each ended span is
counted in ``pointsman_tracing_spans_total{outcome}`` (exported, failed: the receiver refused or could
not be reached; dropped: the queue was full).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from importlib import metadata

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from pointsman_shared.config import TracingConfig

W3C = TraceContextTextMapPropagator()
TRACE_HEADERS = ("traceparent", "tracestate")


class SpanCounts:
    """What became of the ended spans. Each field is written by one thread only (dropped by the
    thread that ends spans, the others by the export thread)."""

    __slots__ = ("dropped", "exported", "failed")

    def __init__(self) -> None:
        self.exported = 0
        self.failed = 0
        self.dropped = 0


class CountingExporter(SpanExporter):
    """An exporter that counts what it exported and what it could not."""

    def __init__(self, exporter: SpanExporter, counts: SpanCounts) -> None:
        self._exporter = exporter
        self._counts = counts

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._exporter.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self._counts.exported += len(spans)
        else:
            self._counts.failed += len(spans)
        return result

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)


class DroppingBatchProcessor(BatchSpanProcessor):
    """The SDK's batch processor, dropping the newest span (counted, not logged) when its queue is full.
    The SDK's own drops the oldest and logs a warning for each, a log line per request at load."""

    def __init__(self, exporter: SpanExporter, counts: SpanCounts, config: TracingConfig) -> None:
        super().__init__(
            exporter,
            max_queue_size=config.max_queue_size,
            schedule_delay_millis=config.schedule_delay * 1000,
            max_export_batch_size=min(config.max_export_batch_size, config.max_queue_size),
            export_timeout_millis=config.export_timeout * 1000,
        )
        self._counts = counts
        self._queue = self._batch_processor._queue
        self._max_queue = config.max_queue_size

    def on_end(self, span: ReadableSpan) -> None:
        if len(self._queue) >= self._max_queue:
            self._counts.dropped += 1
            return
        super().on_end(span)


class SpanCountsCollector(Collector):
    def __init__(self, counts: SpanCounts) -> None:
        self._counts = counts

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "pointsman_tracing_spans", "Ended spans by what became of them", labels=["outcome"]
        )
        counts = self._counts
        family.add_metric(["exported"], counts.exported)
        family.add_metric(["failed"], counts.failed)
        family.add_metric(["dropped"], counts.dropped)
        yield family


def sampler(config: TracingConfig) -> Sampler:
    """The sampler ``config.sampler`` names, the ``*traceidratio`` ones with ``config.ratio``."""
    name = config.sampler
    root: Sampler
    base = name.removeprefix("parentbased_")
    if base == "always_on":
        root = ALWAYS_ON
    elif base == "always_off":
        root = ALWAYS_OFF
    else:
        root = TraceIdRatioBased(config.ratio)
    return ParentBased(root) if name.startswith("parentbased_") else root


def exporter(config: TracingConfig) -> SpanExporter:
    """The OTLP exporter ``config.protocol`` names, sending to ``config.endpoint``."""
    endpoint = config.endpoint
    if config.protocol == "grpc":
        insecure = not endpoint.startswith("https://")
        return GrpcSpanExporter(endpoint=endpoint, insecure=insecure, timeout=config.export_timeout)
    scheme, sep, rest = endpoint.partition("://")
    if sep and "/" not in rest.rstrip("/"):
        endpoint = f"{scheme}://{rest.rstrip('/')}/v1/traces"
    return HttpSpanExporter(endpoint=endpoint, timeout=config.export_timeout)


def resource(config: TracingConfig, service: str) -> Resource:
    """The service's resource: the config's attributes, the service name, the SDK's own. Built here
    rather than by ``Resource.create``, which reads the environment itself (the config did already)."""
    attributes: dict[str, str] = {
        "telemetry.sdk.language": "python",
        "telemetry.sdk.name": "opentelemetry",
        "telemetry.sdk.version": metadata.version("opentelemetry-sdk"),
        **config.resource_attributes,
        "service.name": config.service_name or service,
    }
    return Resource(attributes)


class Tracing:
    """A service's tracer provider, its exporter's counts and its tracers."""

    def __init__(
        self,
        config: TracingConfig,
        service: str,
        *,
        registry: CollectorRegistry | None = None,
        span_exporter: SpanExporter | None = None,
    ) -> None:
        self.config = config
        self.counts = SpanCounts()
        self.provider = TracerProvider(sampler=sampler(config), resource=resource(config, service))
        counted = CountingExporter(span_exporter or exporter(config), self.counts)
        self.provider.add_span_processor(DroppingBatchProcessor(counted, self.counts, config))
        if registry is not None:
            registry.register(SpanCountsCollector(self.counts))
        self._lock = threading.Lock()
        self._closed = False

    def tracer(self, name: str) -> Tracer:
        return self.provider.get_tracer(name)

    def flush(self, timeout: float = 5.0) -> bool:
        return self.provider.force_flush(int(timeout * 1000))

    def shutdown(self) -> None:
        """Export what is queued (within the export timeout), then stop the export thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.provider.shutdown()


def build_tracing(
    config: TracingConfig,
    service: str,
    *,
    registry: CollectorRegistry | None = None,
    span_exporter: SpanExporter | None = None,
) -> Tracing | None:
    """The service's :class:`Tracing`, or ``None`` with tracing off."""
    if not config.enabled:
        return None
    return Tracing(config, service, registry=registry, span_exporter=span_exporter)


def extract(*carriers: Mapping[str, str]) -> Context | None:
    """The trace context of the first carrier with a valid ``traceparent``; ``None`` when none has."""
    for carrier in carriers:
        if "traceparent" in carrier:
            context = W3C.extract(carrier)
            if context:
                return context
    return None


def inject(carrier: MutableMapping[str, str], context: Context | None = None) -> None:
    """Write ``traceparent`` (and ``tracestate``) of ``context`` (default: the current span's)."""
    W3C.inject(carrier, context)


def trace_headers(fields: Iterable[tuple[bytes | str, bytes | str]]) -> dict[str, str]:
    """The W3C headers among gRPC metadata or HTTP header fields (bytes or str pairs, any case)."""
    found: dict[str, str] = {}
    for name, value in fields:
        key = (name.decode("latin-1") if isinstance(name, bytes) else name).lower()
        if key in TRACE_HEADERS and key not in found:
            found[key] = value.decode("latin-1") if isinstance(value, bytes) else value
    return found
