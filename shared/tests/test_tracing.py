"""The tracing edge: the config's ``tracing`` section and its OTEL_* overrides, the provider built from
it, what becomes of each ended span, and the W3C helpers."""

from __future__ import annotations

import base64
import csv
import hashlib
import socket
from importlib import metadata
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, set_span_in_context
from prometheus_client import CollectorRegistry

from pointsman_shared import tracing
from pointsman_shared.config import ConfigError, TracingConfig, parse_config

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, {}),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4317"}, {"endpoint": "http://otel:4317"}),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318/",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            },
            {"endpoint": "http://otel:4318/v1/traces", "protocol": "http/protobuf"},
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4318/custom",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            },
            {"endpoint": "http://traces:4318/custom", "protocol": "http/protobuf"},
        ),
        (
            {"OTEL_TRACES_SAMPLER": "always_on", "OTEL_TRACES_SAMPLER_ARG": "0.5"},
            {"sampler": "always_on", "ratio": 0.5},
        ),
        ({"OTEL_SERVICE_NAME": "edge-picker"}, {"service_name": "edge-picker"}),
        (
            {"OTEL_RESOURCE_ATTRIBUTES": "k8s.pod.name=p-1, deployment.environment=prod%20eu,broken"},
            {"resource_attributes": {"k8s.pod.name": "p-1", "deployment.environment": "prod eu"}},
        ),
        ({"OTEL_SDK_DISABLED": "true"}, {"enabled": False}),
        ({"OTEL_SDK_DISABLED": "false"}, {}),
    ],
)
def test_the_standard_variables_override_the_tracing_section(environ, expected):
    doc = {"tracing": {"enabled": True, "endpoint": "http://config:4317"}}
    config = parse_config(doc, environ=environ).tracing
    defaults = TracingConfig(enabled=True, endpoint="http://config:4317")
    assert config == defaults.model_copy(update=expected)


def test_tracing_is_off_by_default_and_bad_values_name_their_path():
    assert parse_config({}).tracing.enabled is False
    with pytest.raises(ConfigError) as caught:
        parse_config({}, environ={"OTEL_TRACES_SAMPLER": "sometimes", "OTEL_TRACES_SAMPLER_ARG": "2"})
    assert {path for path, _ in caught.value.problems} == {"tracing.sampler", "tracing.ratio"}


@pytest.mark.parametrize(
    ("name", "parent_based", "ratio"),
    [
        ("always_on", False, None),
        ("traceidratio", False, 0.25),
        ("parentbased_traceidratio", True, 0.25),
        ("parentbased_always_off", True, None),
    ],
)
def test_the_sampler_is_the_one_named(name, parent_based, ratio):
    sampler = tracing.sampler(TracingConfig(sampler=name, ratio=0.25))
    assert isinstance(sampler, ParentBased) is parent_based
    if ratio is not None:
        root = sampler._root if parent_based else sampler  # type: ignore[attr-defined]
        assert isinstance(root, TraceIdRatioBased)
        assert root.rate == ratio


def test_off_builds_nothing():
    assert tracing.build_tracing(TracingConfig(), "svc") is None


def _counts(registry: CollectorRegistry) -> dict[str, float]:
    return {
        outcome: registry.get_sample_value("pointsman_tracing_spans_total", {"outcome": outcome}) or 0.0
        for outcome in ("exported", "failed", "dropped")
    }


def test_spans_past_the_queue_are_dropped_and_counted():
    registry = CollectorRegistry()
    exported = InMemorySpanExporter()
    config = TracingConfig(enabled=True, sampler="always_on", max_queue_size=3, schedule_delay=60)
    traced = tracing.build_tracing(config, "svc", registry=registry, span_exporter=exported)
    assert traced is not None
    tracer = traced.tracer("test")
    for _ in range(5):
        tracer.start_span("s").end()
    traced.flush()
    assert len(exported.get_finished_spans()) == 3
    assert _counts(registry) == {"exported": 3, "failed": 0, "dropped": 2}
    traced.shutdown()
    traced.shutdown()  # twice is once


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_receiver_that_is_not_there_is_counted_as_failed(protocol):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    registry = CollectorRegistry()
    config = TracingConfig(
        enabled=True,
        sampler="always_on",
        endpoint=f"http://127.0.0.1:{port}",
        protocol=protocol,
        export_timeout=0.3,
    )
    traced = tracing.build_tracing(config, "svc", registry=registry)
    assert traced is not None
    traced.tracer("test").start_span("s").end()
    traced.flush()
    assert _counts(registry) == {"exported": 0, "failed": 1, "dropped": 0}
    traced.shutdown()


def test_the_resource_names_the_service_and_carries_the_attributes():
    config = TracingConfig(resource_attributes={"k8s.pod.name": "p-1", "service.name": "ignored"})
    attributes = tracing.resource(config, "pointsman-picker").attributes
    assert attributes["service.name"] == "pointsman-picker"
    assert attributes["k8s.pod.name"] == "p-1"
    named = tracing.resource(config.model_copy(update={"service_name": "edge"}), "pointsman-picker")
    assert named.attributes["service.name"] == "edge"


def test_w3c_context_goes_out_and_comes_back():
    traced = tracing.Tracing(
        TracingConfig(enabled=True, sampler="always_on"), "svc", span_exporter=InMemorySpanExporter()
    )
    parent = tracing.extract({"traceparent": PARENT})
    assert parent is not None
    span = traced.tracer("t").start_span("child", context=parent, kind=SpanKind.SERVER)
    carrier: dict[str, str] = {}
    tracing.inject(carrier, set_span_in_context(span))
    assert carrier["traceparent"].startswith(f"00-{TRACE_ID}-")
    assert carrier["traceparent"] != PARENT
    span.end()
    traced.shutdown()


@pytest.mark.parametrize(
    ("carriers", "found"),
    [
        (({}, {"traceparent": PARENT}), True),
        (({"traceparent": "garbage"}, {}), False),
        (({"traceparent": "garbage"}, {"traceparent": PARENT}), True),
        (({"other": "x"},), False),
    ],
)
def test_extract_takes_the_first_valid_context(carriers, found):
    assert (tracing.extract(*carriers) is not None) is found


def test_trace_headers_are_found_in_metadata_of_either_kind():
    fields = [
        (b":path", b"/x"),
        (b"TraceParent", PARENT.encode()),
        (b"traceparent", b"second"),
        (b"tracestate", b"a=1"),
    ]
    assert tracing.trace_headers(fields) == {"traceparent": PARENT, "tracestate": "a=1"}
    assert tracing.trace_headers((("traceparent", PARENT),)) == {"traceparent": PARENT}


def test_the_otlp_modules_are_opentelemetry_proto_s_not_the_copy_in_xds_protos():
    # xds-protos ships an older opentelemetry/proto/...; `make install` and the picker's image put
    # opentelemetry-proto's back last. Every file it lists must be its own.
    dist = metadata.distribution("opentelemetry-proto")
    record = dist.read_text("RECORD") or ""
    checked = 0
    for path, digest, _size in csv.reader(record.splitlines()):
        if path.endswith("_pb2.py") and digest:
            algorithm, _, expected = digest.partition("=")
            data = Path(str(dist.locate_file(path))).read_bytes()
            actual = base64.urlsafe_b64encode(hashlib.new(algorithm, data).digest()).rstrip(b"=").decode()
            assert actual == expected, f"{path} is not opentelemetry-proto's: reinstall it after xds-protos"
            checked += 1
    assert checked > 5
