"""The ext_proc protocol through a real Envoy: response-side counting (the stack's Envoy, as shipped:
response headers to the picker, sizes and usage through Envoy's Lua filter and gRPC access log; a second
Envoy showing the picker every body chunk, a third no body at all) and FULL_DUPLEX_STREAMED request
bodies, or STREAMED ones sent without waiting for the header answer (other Envoys, same picker)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from envoy.service.accesslog.v3 import als_pb2
from integration_kit import POD_HEADER, Pool, completion
from prometheus_client.parser import text_string_to_metric_families

from pointsman_devstack import envoy
from pointsman_devstack.ports import free_port
from pointsman_devstack.process import ManagedProcess
from pointsman_devstack.readiness import http_ok, wait_ready
from pointsman_devstack.stack import LOOPBACK, Stack
from pointsman_shared.config import join_host_port

pytestmark = pytest.mark.integration

LABELS = {"model_name": "sql-lora", "target_model_name": "sql-lora"}


def picker_samples(stack: Stack) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"http://127.0.0.1:{stack.ports.picker_metrics}/metrics", timeout=5).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> float:
    return samples.get((name, tuple(sorted(LABELS.items()))), 0.0)


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def usage_of_json_and_sse(client: httpx.Client) -> tuple[httpx.Response, list[str], dict[str, int]]:
    """A plain completion (5 tokens) and a streamed one with usage (8 tokens), checked whole."""
    plain = client.post("/v1/completions", json=completion("sql-lora", max_tokens=5))
    assert plain.status_code == 200, plain.text
    request = completion("sql-lora", max_tokens=8, stream=True, stream_options={"include_usage": True})
    with client.stream("POST", "/v1/completions", json=request) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    # The stream reached the client whole: every event, the usage chunk, then [DONE].
    assert events[-1] == "data: [DONE]"
    usage = json.loads(events[-2].removeprefix("data: "))["usage"]
    assert usage["completion_tokens"] == 8
    return plain, events, usage


def check_usage_counted(client: httpx.Client, stack: Stack) -> None:
    before = picker_samples(stack)
    plain, events, usage = usage_of_json_and_sse(client)

    def delta(name: str) -> float:
        return sample(picker_samples(stack), name) - sample(before, name)

    # Through the access log the figures come with Envoy's next flush (0.5 s).
    wait_for(lambda: delta("inference_model_output_tokens_count") >= 2)
    assert delta("inference_model_request_duration_seconds_count") == 2
    assert delta("inference_model_request_sizes_count") == 2
    assert delta("inference_model_response_sizes_sum") == len(plain.content) + sum(len(e) + 2 for e in events)
    assert delta("inference_model_output_tokens_sum") == 5 + 8
    assert (
        delta("inference_model_input_tokens_sum")
        == plain.json()["usage"]["prompt_tokens"] + usage["prompt_tokens"]
    )


def test_usage_of_json_and_sse_responses_comes_through_the_access_log(
    gateway: httpx.Client, stack: Stack, pool: Pool
) -> None:
    before = picker_samples(stack)
    check_usage_counted(gateway, stack)
    entries = picker_samples(stack).get(
        ("pointsman_picker_access_log_entries_total", (("result", "recorded"),))
    )
    recorded_before = before.get(
        ("pointsman_picker_access_log_entries_total", (("result", "recorded"),)), 0.0
    )
    assert entries is not None
    assert entries - recorded_before == 2


def test_a_stream_without_usage_gets_its_size_and_no_tokens(
    gateway: httpx.Client, stack: Stack, pool: Pool
) -> None:
    before = picker_samples(stack)
    request = completion("sql-lora", max_tokens=8, stream=True)
    with gateway.stream("POST", "/v1/completions", json=request) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert len(events) == 9  # every token and [DONE] reached the client

    def delta(name: str) -> float:
        return sample(picker_samples(stack), name) - sample(before, name)

    wait_for(lambda: delta("inference_model_response_sizes_count") >= 1)
    assert delta("inference_model_request_duration_seconds_count") == 1
    assert delta("inference_model_response_sizes_sum") == sum(len(e) + 2 for e in events)
    assert delta("inference_model_output_tokens_count") == 0


def test_a_malformed_access_log_entry_is_counted_and_the_log_goes_on(
    gateway: httpx.Client, stack: Stack, pool: Pool
) -> None:
    key = ("pointsman_picker_access_log_entries_total", (("result", "malformed"),))
    before = picker_samples(stack).get(key, 0.0)
    message = als_pb2.StreamAccessLogsMessage()
    entry = message.http_logs.log_entry.add()
    entry.common_properties.metadata.filter_metadata["pointsman.route"].update({"model": 7, "target": "x"})
    entry.common_properties.metadata.filter_metadata["pointsman.usage"].update({"prompt_tokens": "lots"})
    with grpc.insecure_channel(f"127.0.0.1:{stack.ports.picker}") as channel:
        call = channel.stream_stream(
            "/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs",
            request_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString(),
            response_deserializer=als_pb2.StreamAccessLogsResponse.FromString,
        )
        # Not even a message: dropped, and the stream still reads the next one.
        answers = list(call(iter([b"\xff\xff", message]), timeout=5))
    assert answers == [als_pb2.StreamAccessLogsResponse()]
    assert picker_samples(stack).get(key, 0.0) - before == 1
    # Envoy's own log to the picker is untouched: its next entries are recorded.
    check_usage_counted(gateway, stack)


@pytest.fixture(scope="module")
def streamed_gateway(stack: Stack) -> Iterator[httpx.Client]:
    """A second Envoy showing the picker every response body chunk (response body STREAMED)."""
    yield from second_gateway(stack, "envoy-streamed", response_body=envoy.RESPONSE_STREAMED)


def test_streamed_bodies_are_counted_by_the_picker(
    streamed_gateway: httpx.Client, stack: Stack, pool: Pool
) -> None:
    check_usage_counted(streamed_gateway, stack)


def test_a_stream_without_usage_is_not_shown_to_the_picker(
    streamed_gateway: httpx.Client, stack: Stack, pool: Pool
) -> None:
    before = picker_samples(stack)
    request = completion("sql-lora", max_tokens=8, stream=True)
    with streamed_gateway.stream("POST", "/v1/completions", json=request) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert len(events) == 9  # every token and [DONE] reached the client

    def delta(name: str) -> float:
        return sample(picker_samples(stack), name) - sample(before, name)

    # The picker turned the body off at the response headers (mode_override): the exchange ends when
    # Envoy closes the stream, just after the client has the last byte.
    wait_for(lambda: delta("inference_model_request_duration_seconds_count") >= 1)
    assert delta("inference_model_request_duration_seconds_count") == 1
    assert delta("inference_model_response_sizes_count") == 0


def second_gateway(stack: Stack, name: str, **options: object) -> Iterator[httpx.Client]:
    """Another Envoy in front of the same picker, with ``options`` (EnvoyOptions fields) changed."""
    run_dir: Path = stack.run_dir / name
    run_dir.mkdir(exist_ok=True)
    gateway, admin = join_host_port(LOOPBACK, free_port()), join_host_port(LOOPBACK, free_port())
    envoy_options = envoy.EnvoyOptions(
        gateway_listen=gateway,
        admin_listen=admin,
        pickers=(join_host_port(LOOPBACK, stack.ports.picker),),
        **options,  # type: ignore[arg-type]
    )
    path = envoy.write_bootstrap(envoy_options, run_dir / "envoy.yaml")
    argv = [envoy.find_envoy(), "-c", str(path), "--disable-hot-restart", "--concurrency", "1"]
    process = ManagedProcess(name, argv, env={}, log_path=run_dir / "envoy.log")
    try:
        with httpx.Client(timeout=1.0) as probe:
            wait_ready(process, http_ok(probe, f"http://{admin}/ready"), timeout=30, what="admin /ready")
        with httpx.Client(base_url=f"http://{gateway}", timeout=30.0) as client:
            yield client
    finally:
        process.stop(5.0)


@pytest.fixture(scope="module")
def full_duplex_gateway(stack: Stack) -> Iterator[httpx.Client]:
    """A second Envoy in front of the same picker, sending request bodies FULL_DUPLEX_STREAMED."""
    yield from second_gateway(stack, "envoy-full-duplex", request_body_mode="FULL_DUPLEX_STREAMED")


@pytest.fixture(scope="module")
def early_body_gateway(stack: Stack) -> Iterator[httpx.Client]:
    """A second Envoy in front of the same picker, sending request bodies STREAMED without waiting for
    the header answer (which the picker holds until the body is in)."""
    yield from second_gateway(
        stack, "envoy-early-body", request_body_mode=envoy.STREAMED, body_without_waiting=True
    )


@pytest.fixture(scope="module")
def headers_only_gateway(stack: Stack) -> Iterator[httpx.Client]:
    """A second Envoy showing the picker response headers but not response bodies."""
    yield from second_gateway(stack, "envoy-headers-only", response_body=envoy.NO_BODY)


def test_without_response_bodies_each_exchange_still_completes_once(
    headers_only_gateway: httpx.Client, stack: Stack, pool: Pool
) -> None:
    before = picker_samples(stack)
    usage_of_json_and_sse(headers_only_gateway)

    def delta(name: str) -> float:
        return sample(picker_samples(stack), name) - sample(before, name)

    # Envoy holds each picker stream until its response is over, and closes it just after the client
    # has the last byte: that end is counted, once each.
    wait_for(lambda: delta("inference_model_request_duration_seconds_count") >= 2)
    assert delta("inference_model_request_duration_seconds_count") == 2
    assert delta("inference_model_request_sizes_count") == 2
    # What only the body tells is not made up.
    assert delta("inference_model_response_sizes_count") == 0
    assert delta("inference_model_output_tokens_count") == 0
    running = picker_samples(stack).get(
        ("inference_objective_running_requests", (("model_name", "sql-lora"),))
    )
    assert running == 0.0


def chunked(data: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


@pytest.mark.parametrize("prompt_bytes", [10, 200_000])
@pytest.mark.parametrize("mode", ["full_duplex", "early_body"])
def test_a_streamed_body_in_many_chunks_is_routed_and_rewritten(
    request: pytest.FixtureRequest, stack: Stack, pool: Pool, prompt_bytes: int, mode: str
) -> None:
    # tweet-summary always resolves to another name, so the body is rewritten (and, when big, sent
    # back to Envoy in several 62,000-byte chunks, FULL_DUPLEX_STREAMED; STREAMED: in place of the last
    # chunk, the earlier ones cleared).
    gateway: httpx.Client = request.getfixturevalue(f"{mode}_gateway")
    data = json.dumps(completion("tweet-summary", prompt="x" * prompt_bytes)).encode()
    response = gateway.post("/v1/completions", content=chunked(data, 16_384))
    assert response.status_code == 200, response.text
    assert response.headers[POD_HEADER] in stack.pod_addresses
    assert response.json()["model"].startswith("tweet-summary-")


def test_the_debug_header_explains_the_decision(gateway: httpx.Client, pool: Pool) -> None:
    asked = gateway.post("/v1/completions", json=completion("sql-lora"), headers={"x-pointsman-explain": "1"})
    assert asked.status_code == 200, asked.text
    path = asked.headers["x-pointsman-explain"]
    assert "critical request:3 > low queueing:3" in path
    assert path.endswith(f"picked {asked.headers[POD_HEADER]}")
    plain = gateway.post("/v1/completions", json=completion("sql-lora"))
    assert "x-pointsman-explain" not in plain.headers
