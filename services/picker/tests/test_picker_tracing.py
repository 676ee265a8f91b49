"""The picker's route span, through the real servers (native and grpcio) and a real gRPC client; the
spans land in the SDK's in-memory exporter behind the real provider and batch processor."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from picker_builders import NOW, body, config, on_free_ports, pod, pool_pods, post_headers, snapshot
from prometheus_client import CollectorRegistry

from pointsman_picker.server import PickerApp, create_app
from pointsman_picker.snapshots import StaticSnapshotSource
from pointsman_picker.tracing import SPAN_NAME
from pointsman_shared.config import TracingConfig
from pointsman_shared.tracing import Tracing

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
ENVOY_SPAN = "00f067aa0ba902b7"
CLIENT_SPAN = "1111111111111111"


def traceparent(span_id: str, sampled: bool = True) -> str:
    return f"00-{TRACE_ID}-{span_id}-{'01' if sampled else '00'}"


@dataclass
class Traced:
    app: PickerApp
    spans: InMemorySpanExporter
    stub: pb_grpc.ExternalProcessorStub

    async def request(
        self,
        model: str,
        *,
        metadata: tuple[tuple[str, str], ...] = (),
        headers: tuple[tuple[str, str], ...] = (),
    ) -> list[pb.ProcessingResponse]:
        data = json.dumps({"model": model, "prompt": "hi"}).encode()
        messages = iter([post_headers(("x-request-id", "r-1"), *headers), body(data)])
        return [response async for response in self.stub.Process(messages, metadata=metadata)]

    def finished(self) -> list[ReadableSpan]:
        assert self.app.tracing is not None
        self.app.tracing.flush()
        return [span for span in self.spans.get_finished_spans() if span.name == SPAN_NAME]


@pytest.fixture(params=["native", "grpcio"])
async def traced(request):
    source = StaticSnapshotSource()
    source.set(snapshot(*pool_pods(pod(3, 0.2), pod(0, 0.1))))
    cfg = on_free_ports(config(picker={"server": request.param}))
    spans = InMemorySpanExporter()
    # Root requests unsampled (ratio 0): only a sampled parent makes a span.
    tracing = Tracing(TracingConfig(enabled=True, ratio=0.0), "pointsman-picker", span_exporter=spans)
    app = create_app(
        cfg,
        source=source,
        registry=CollectorRegistry(),
        rng=random.Random(0),
        clock=lambda: NOW + 0.25,
        tracing=tracing,
    )
    await app.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.port}")
    try:
        yield Traced(app, spans, pb_grpc.ExternalProcessorStub(channel))
    finally:
        await channel.close()
        await app.stop(0)


async def test_a_routed_request_s_span_is_a_child_of_envoy_s_call_span(traced):
    await traced.request("my-model", metadata=(("traceparent", traceparent(ENVOY_SPAN)),))
    (span,) = traced.finished()
    assert span.kind is SpanKind.SERVER
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    assert span.parent is not None
    assert f"{span.parent.span_id:016x}" == ENVOY_SPAN
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.request.model"] == "my-model"
    assert attributes["pointsman.target_model"] == "my-model-12345"
    assert attributes["pointsman.priority"] == 0
    assert attributes["pointsman.profile"] == "default"
    assert attributes["pointsman.endpoint"] == "192.168.1.2:8000"
    assert attributes["pointsman.result"] == "picked"
    assert attributes["pointsman.pods"] == 2
    assert attributes["pointsman.request_id"] == "r-1"
    assert str(attributes["pointsman.explain"]).startswith("pods=2")
    assert attributes["pointsman.snapshot_age_s"] == pytest.approx(0.25)


async def test_the_call_s_metadata_wins_over_the_request_s_header(traced):
    await traced.request(
        "my-model",
        metadata=(("traceparent", traceparent(ENVOY_SPAN)),),
        headers=(("traceparent", traceparent(CLIENT_SPAN)),),
    )
    (span,) = traced.finished()
    assert f"{span.parent.span_id:016x}" == ENVOY_SPAN


async def test_the_request_s_header_is_the_parent_without_call_metadata(traced):
    await traced.request("my-model", headers=(("traceparent", traceparent(CLIENT_SPAN)),))
    (span,) = traced.finished()
    assert f"{span.parent.span_id:016x}" == CLIENT_SPAN


@pytest.mark.parametrize(
    "metadata",
    [(), (("traceparent", traceparent(ENVOY_SPAN, sampled=False)),)],
    ids=["no context, ratio 0", "unsampled parent"],
)
async def test_no_span_where_the_sampler_says_no(traced, metadata):
    responses = await traced.request("my-model", metadata=metadata)
    assert len(responses) == 2  # routed all the same
    assert traced.finished() == []


async def test_a_refused_request_s_span_says_why(traced):
    await traced.request("no-such-model", metadata=(("traceparent", traceparent(ENVOY_SPAN)),))
    (span,) = traced.finished()
    attributes = dict(span.attributes or {})
    assert attributes["pointsman.result"] == "unknown_model"
    assert attributes["http.response.status_code"] == 404
    assert span.status.status_code is StatusCode.UNSET  # a client's mistake, not the picker's


async def test_a_dropped_request_names_the_drop_reason(traced):
    traced.app.source.set(snapshot(*pool_pods(pod(300, 0.95), pod(300, 0.95))))
    await traced.request("sql-lora-sheddable", metadata=(("traceparent", traceparent(ENVOY_SPAN)),))
    (span,) = traced.finished()
    attributes = dict(span.attributes or {})
    assert attributes["pointsman.result"] == "no_capacity"
    assert attributes["http.response.status_code"] == 429
    assert attributes["pointsman.drop_reason"]
    assert "dropped" in str(attributes["pointsman.explain"])


async def test_off_builds_no_tracer():
    app = create_app(on_free_ports(config()), source=StaticSnapshotSource(), registry=CollectorRegistry())
    assert app.tracing is None
    assert app.service.tracer is None
