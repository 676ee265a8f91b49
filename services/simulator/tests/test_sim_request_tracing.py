"""The simulator's llm_request span, through the pod's real app and engine; the spans land in the SDK's
in-memory exporter behind the real provider and batch processor."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from pointsman_shared.config import TracingConfig
from pointsman_shared.tracing import Tracing
from pointsman_sim.__main__ import tracing_config
from pointsman_sim.app import create_app
from pointsman_sim.engine import Engine, EngineConfig
from pointsman_sim.pod import DEFAULT_MODEL, PodSpec, SimPod
from pointsman_sim.request_tracing import SPAN_NAME, RequestTracer

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
SPEEDUP = 1000.0


@pytest.fixture
async def traced() -> AsyncIterator[tuple[httpx.AsyncClient, Tracing, InMemorySpanExporter]]:
    spans = InMemorySpanExporter()
    tracing = Tracing(
        TracingConfig(enabled=True, sampler="parentbased_always_on"), "pointsman-sim", span_exporter=spans
    )
    spec = PodSpec(name="pod-1", adapters=("sql-lora",), engine=EngineConfig(max_loras=1), speedup=SPEEDUP)
    async with SimPod(spec) as pod:
        tracer = RequestTracer(tracing.tracer("pointsman_sim"), pod=pod.name, speedup=SPEEDUP)
        transport = httpx.ASGITransport(app=create_app(pod, tracer=tracer))
        async with httpx.AsyncClient(transport=transport, base_url="http://pod") as client:
            yield client, tracing, spans
    tracing.shutdown()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_finished_request_s_span_is_a_child_of_its_traceparent(traced, stream):
    client, tracing, spans = traced
    body = {"model": "sql-lora", "prompt": "x" * 400, "max_tokens": 4, "stream": stream}
    response = await client.post("/v1/completions", json=body, headers={"traceparent": PARENT})
    assert response.status_code == 200
    tracing.flush()
    (span,) = [s for s in spans.get_finished_spans() if s.name == SPAN_NAME]
    assert span.kind is SpanKind.SERVER
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    assert f"{span.parent.span_id:016x}" == "00f067aa0ba902b7"
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.response.model"] == "sql-lora"
    assert attributes["gen_ai.usage.prompt_tokens"] == 100
    assert attributes["gen_ai.usage.completion_tokens"] == 4
    assert attributes["pointsman_sim.adapter"] == "sql-lora"
    # The first use loads the adapter from disk: 57 + 2.9 * 16 + 9 ms, simulated.
    assert attributes["pointsman_sim.adapter_load_s"] == pytest.approx(0.1124 / SPEEDUP)
    parts = ("time_in_queue", "time_in_model_prefill", "time_in_model_decode")
    total = sum(float(attributes[f"gen_ai.latency.{part}"]) for part in parts)
    assert total == pytest.approx(float(attributes["gen_ai.latency.e2e"]))
    assert span.start_time <= span.end_time


async def test_an_unsampled_parent_makes_no_span(traced):
    client, tracing, spans = traced
    unsampled = PARENT[:-2] + "00"
    body = {"model": DEFAULT_MODEL, "prompt": "x", "max_tokens": 2}
    assert (
        await client.post("/v1/completions", json=body, headers={"traceparent": unsampled})
    ).status_code == 200
    tracing.flush()
    assert spans.get_finished_spans() == ()


def test_the_engine_records_when_a_request_was_scheduled_and_its_adapter_load():
    engine = Engine(EngineConfig(max_loras=1, max_num_seqs=1))
    engine.submit("a", 10, 1, "lora-a", now=0.0)
    engine.submit("b", 10, 1, "lora-b", now=0.0)
    finished = []
    now = 0.0
    while engine.has_work:
        result = engine.step(now)
        finished += result.finished
        now = result.ends_at
    first, second = sorted(finished, key=lambda r: r.finished_at)
    assert first.scheduled_at == 0.0
    assert first.adapter_load == pytest.approx(0.1124)
    assert second.scheduled_at == pytest.approx(first.finished_at)  # it waited for the only slot
    assert second.time_in_queue == pytest.approx(first.finished_at)
    assert second.adapter_load == pytest.approx(0.1124)


def test_the_flag_s_endpoint_wins_and_otel_variables_apply():
    environ = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://env:4317", "OTEL_TRACES_SAMPLER": "always_off"}
    config = tracing_config("http://flag:4317", environ)
    assert (config.enabled, config.endpoint, config.sampler) == (True, "http://flag:4317", "always_off")
    assert tracing_config("http://flag:4317", {}).sampler == "parentbased_always_on"
    assert tracing_config("http://flag:4317", {"OTEL_SDK_DISABLED": "true"}).enabled is False
