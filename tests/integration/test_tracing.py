"""One trace per request through the real stack: Envoy's OpenTelemetry tracer, the picker, the
simulator pods and the collector export OTLP/gRPC to a receiver in the test (decoding with
opentelemetry-proto). Envoy's spans are flushed every 0.5 s here (5 s by default)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from integration_kit import POD_HEADER, TEST_CONFIG, completion, metric_sum, stack_environ

from pointsman_devstack.stack import SimOptions, Stack, StackOptions, StackPorts
from pointsman_shared.config import load_config
from pointsman_testkit.otlp import OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.integration

BASE = "meta-llama/Llama-3.1-8B-Instruct"
GATEWAY, PICKER, SIM, COLLECTOR = (
    "pointsman-gateway",
    "pointsman-picker",
    "pointsman-sim",
    "pointsman-collector",
)


def _stack(directory: Path, tracing: dict[str, object], environ: dict[str, str] | None = None) -> Stack:
    doc = yaml.safe_load(TEST_CONFIG.read_text(encoding="utf-8"))
    doc["tracing"] = tracing
    config_path = directory / "pointsman-tracing.yaml"
    config_path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    config = load_config(config_path, environ={})
    return Stack(
        StackOptions(
            config_path=config_path,
            run_dir=directory,
            ports=StackPorts.free(len(config.pool.endpoints)),
            sim=SimOptions.for_config(config, max_loras=4),
            environ={**stack_environ(), **(environ or {})},
            envoy_trace_flush_ms=500,
        )
    )


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


@pytest.fixture(scope="module")
def traced_stack(tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver) -> Iterator[Stack]:
    tracing = {
        "enabled": True,
        "endpoint": receiver.grpc_endpoint,
        "sampler": "parentbased_always_on",
        "scheduleDelay": "100ms",
        "exportTimeout": "500ms",
    }
    with _stack(tmp_path_factory.mktemp("traced"), tracing) as stack:
        yield stack


@pytest.fixture(scope="module")
def gateway(traced_stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=traced_stack.gateway_url, timeout=30.0) as client:
        yield client


def trace_of(spans: list[ReceivedSpan], trace_id: str) -> list[ReceivedSpan]:
    return [span for span in spans if span.trace_id == trace_id]


def traceparent(trace_id: str, sampled: bool) -> str:
    return f"00-{trace_id}-{secrets.token_hex(8)}-{'01' if sampled else '00'}"


def whole(trace_id: str):  # type: ignore[no-untyped-def]
    """The trace has the spans of Envoy (request and ext_proc call), the picker and the pod."""

    def done(spans: list[ReceivedSpan]) -> bool:
        services = [span.service for span in trace_of(spans, trace_id)]
        return services.count(GATEWAY) >= 2 and PICKER in services and SIM in services

    return done


def test_one_trace_per_request_from_envoy_through_the_picker_to_the_pod(
    gateway: httpx.Client, receiver: OtlpReceiver, traced_stack: Stack
) -> None:
    trace_id = secrets.token_hex(16)
    client_span = traceparent(trace_id, sampled=True).split("-")[2]
    response = gateway.post(
        "/v1/completions",
        json=completion("sql-lora"),
        headers={"traceparent": f"00-{trace_id}-{client_span}-01"},
    )
    assert response.status_code == 200, response.text
    spans = trace_of(receiver.wait_for(whole(trace_id)), trace_id)
    by_id = {span.span_id: span for span in spans}
    (picker,) = [s for s in spans if s.service == PICKER]
    (pod,) = [s for s in spans if s.service == SIM]
    # Envoy's request span is the child of the client's; its ext_proc call span is the picker's parent.
    (request,) = [s for s in spans if s.service == GATEWAY and s.parent_span_id == client_span]
    call = by_id[picker.parent_span_id]
    assert call.service == GATEWAY
    assert call.kind == "client"
    assert call.parent_span_id == request.span_id
    # The pod's parent is Envoy's request span (or the router's span under it).
    ancestor = by_id[pod.parent_span_id]
    assert ancestor.service == GATEWAY
    assert request.span_id in (ancestor.span_id, ancestor.parent_span_id)
    assert picker.name == "pointsman.picker.route"
    assert picker.attributes["gen_ai.request.model"] == "sql-lora"
    assert picker.attributes["pointsman.target_model"] == "sql-lora"
    assert picker.attributes["pointsman.endpoint"] == response.headers[POD_HEADER]
    assert picker.attributes["pointsman.result"] == "picked"
    assert picker.attributes["pointsman.pods"] == 3
    assert "pods=3; " in str(picker.attributes["pointsman.explain"])  # after what resolved the model
    assert float(picker.attributes["pointsman.snapshot_age_s"]) >= 0
    assert pod.name == "llm_request"
    assert pod.attributes["gen_ai.response.model"] == "sql-lora"
    assert pod.attributes["gen_ai.usage.completion_tokens"] == 4
    assert pod.attributes["pointsman_sim.pod"] == response.headers[POD_HEADER]
    assert "gen_ai.latency.time_in_queue" in pod.attributes
    # Each hop's span lies within its parent's.
    assert request.start_ns <= picker.start_ns <= picker.end_ns <= request.end_ns


def test_a_request_without_a_context_is_traced_by_envoy_s_sampling(
    gateway: httpx.Client, receiver: OtlpReceiver
) -> None:
    response = gateway.post("/v1/completions", json=completion(BASE))
    assert response.status_code == 200, response.text
    pod = response.headers[POD_HEADER]

    def routed_there(spans: list[ReceivedSpan]) -> bool:
        return any(s.service == PICKER and s.attributes.get("pointsman.endpoint") == pod for s in spans)

    spans = receiver.wait_for(routed_there)
    picker = [s for s in spans if s.service == PICKER and s.attributes.get("pointsman.endpoint") == pod][-1]
    receiver.wait_for(whole(picker.trace_id))


def test_an_unsampled_context_makes_no_span_anywhere(gateway: httpx.Client, receiver: OtlpReceiver) -> None:
    unsampled, sampled = secrets.token_hex(16), secrets.token_hex(16)
    for trace_id, flag in ((unsampled, False), (sampled, True)):
        response = gateway.post(
            "/v1/completions", json=completion(BASE), headers={"traceparent": traceparent(trace_id, flag)}
        )
        assert response.status_code == 200, response.text
    # Each service exports in order: once the later trace has arrived whole, the earlier one had its turn.
    spans = receiver.wait_for(whole(sampled))
    assert trace_of(spans, unsampled) == []


def test_the_collector_traces_its_publish_rounds(receiver: OtlpReceiver, traced_stack: Stack) -> None:
    spans = receiver.wait_for(lambda spans: any(s.service == COLLECTOR for s in spans))
    publish = [s for s in spans if s.name == "pointsman.collector.publish"]
    assert publish
    assert publish[-1].attributes["pointsman.pods"] == 3


def test_a_receiver_outage_costs_no_request(
    gateway: httpx.Client, receiver: OtlpReceiver, traced_stack: Stack
) -> None:
    # Last in this module: the receiver does not come back.
    receiver.close()
    statuses = [gateway.post("/v1/completions", json=completion(BASE)).status_code for _ in range(30)]
    assert statuses == [200] * 30
    metrics = f"http://127.0.0.1:{traced_stack.ports.picker_metrics}/metrics"
    with httpx.Client(timeout=5.0) as client:

        def failed() -> float:
            return metric_sum(client, metrics, "pointsman_tracing_spans_total", outcome="failed")

        sent = 0
        while failed() == 0 and sent < 200:  # until the exporter's next batch has failed
            assert gateway.post("/v1/completions", json=completion(BASE)).status_code == 200
            sent += 1
        assert failed() > 0


def test_tracing_off_sends_no_span_even_with_otel_variables_set(tmp_path: Path) -> None:
    with OtlpReceiver() as receiver:
        environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint, "OTEL_TRACES_SAMPLER": "always_on"}
        with _stack(tmp_path, {"enabled": False}, environ) as stack, httpx.Client(timeout=30.0) as client:
            trace_id = secrets.token_hex(16)
            for _ in range(5):
                response = client.post(
                    f"{stack.gateway_url}/v1/completions",
                    json=completion(BASE),
                    headers={"traceparent": traceparent(trace_id, True)},
                )
                assert response.status_code == 200, response.text
            assert stack.process("envoy") is not None
        # Every process has stopped, so every span it would have sent has been sent.
        assert receiver.spans() == []
        assert receiver.requests == 0
