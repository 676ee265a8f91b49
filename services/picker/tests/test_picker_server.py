"""Hermetic tests: the real grpc.aio server on port 0, a real gRPC client, an in-memory snapshot.

Spec §5 end-to-end cases 6-10 (pool port 8000, pod i at 192.168.1.(i+1)), the error answers, health,
metrics and shutdown.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import urllib.request
from dataclasses import dataclass

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.accesslog.v3 import als_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from picker_builders import (
    NOW,
    body,
    config,
    headers,
    metadata,
    on_free_ports,
    pod,
    pool_pods,
    post_headers,
    set_headers,
    snapshot,
)
from prometheus_client import CollectorRegistry

from pointsman_picker.health import LIVENESS, READINESS_SERVICES
from pointsman_picker.server import PickerApp, create_app
from pointsman_picker.snapshots import StaticSnapshotSource
from pointsman_testkit import eventually

DEST = "x-gateway-destination-endpoint"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class Picker:
    app: PickerApp
    source: StaticSnapshotSource
    stub: pb_grpc.ExternalProcessorStub
    channel: grpc.aio.Channel

    async def exchange(self, *messages: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        """One ext_proc stream: send the messages, collect every response."""
        return [response async for response in self.stub.Process(iter(messages))]

    def use(self, *pods) -> None:
        self.source.set(snapshot(*pool_pods(*pods)))


@pytest.fixture(params=["native", "grpcio"])
async def picker(request):
    source = StaticSnapshotSource()
    cfg = on_free_ports(config(picker={"maxBodyBytes": 1000, "server": request.param}))
    app = create_app(
        cfg, source=source, registry=CollectorRegistry(), rng=random.Random(0), clock=lambda: NOW
    )
    await app.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.port}")
    try:
        yield Picker(app, source, pb_grpc.ExternalProcessorStub(channel), channel)
    finally:
        await channel.close()
        await app.stop(0)


def completion(model: str) -> bytes:
    return (
        json.dumps({"max_tokens": 100, "model": model, "prompt": "test1", "temperature": 0})
        .replace(" ", "")
        .encode()
    )


async def test_case6_critical_rewrite_and_content_length(picker):
    picker.use(pod(3, 0.2), pod(0, 0.1), pod(10, 0.2))
    first, second = await picker.exchange(post_headers(), body(completion("my-model")))
    assert first.request_headers.response.clear_route_cache
    assert set_headers(second) == {DEST: "192.168.1.2:8000", "Content-Length": "76"}
    assert second.request_body.response.body_mutation.body == completion("my-model-12345")
    # No protocol_config: the response body is not shown (mode NONE), so the route is written for the
    # access log too.
    assert metadata(second) == {
        "envoy.lb": {DEST: "192.168.1.2:8000"},
        "pointsman.route": {"model": "my-model", "target": "my-model-12345"},
    }


@pytest.mark.parametrize(
    ("model", "pods", "expected"),
    [
        # 7
        (
            "sql-lora",
            [
                pod(0, 0.2, adapters={"foo", "bar"}),
                pod(0, 0.1, adapters={"foo", "sql-lora-1fdg2"}),
                pod(10, 0.2, adapters={"foo", "bar"}),
            ],
            "192.168.1.2:8000",
        ),
        # 8
        (
            "sql-lora",
            [
                pod(10, 0.2, adapters={"foo", "bar"}),
                pod(200, 0.1, adapters={"foo", "sql-lora-1fdg2"}),
                pod(6, 0.2, adapters={"foo"}),
            ],
            "192.168.1.3:8000",
        ),
        # 10
        (
            "sql-lora-sheddable",
            [
                pod(4, 0.2, adapters={"foo", "bar"}),
                pod(0, 0.85, adapters={"foo"}),
                pod(10, 0.9, adapters={"foo"}),
            ],
            "192.168.1.1:8000",
        ),
    ],
)
async def test_cases_7_8_10_destination(picker, model, pods, expected):
    picker.use(*pods)
    _, answer = await picker.exchange(post_headers(), body(completion(model)))
    assert set_headers(answer)[DEST] == expected
    assert metadata(answer)["envoy.lb"] == {DEST: expected}


async def test_case9_sheddable_without_capacity_is_429(picker):
    picker.use(pod(6, 0.2, adapters={"foo"}), pod(0, 0.85, adapters={"foo"}), pod(10, 0.9, adapters={"foo"}))
    first, second = await picker.exchange(post_headers(), body(completion("sql-lora-sheddable")))
    assert first.WhichOneof("response") == "request_headers"
    assert second.immediate_response.status.code == 429
    assert json.loads(second.immediate_response.body)["error"]["code"] == 429


async def test_unchanged_model_forwards_the_body_untouched(picker):
    picker.use(pod())
    raw = b'{ "model": "plain", "prompt": "<b>" }'
    _, answer = await picker.exchange(post_headers(), body(raw))
    assert set_headers(answer) == {DEST: "192.168.1.1:8000", "Content-Length": str(len(raw))}
    assert not answer.request_body.response.HasField("body_mutation")


@pytest.mark.parametrize(
    ("chunks", "status"),
    [
        ([b"not json"], 400),
        ([b'{"prompt":"no model"}'], 400),
        ([b'{"model":7}'], 400),
        ([b'{"model":"unknown-model"}'], 404),
        ([b"x" * 1001], 413),
        ([b"x" * 600, b"x" * 600], 413),
    ],
)
async def test_error_answers(picker, chunks, status):
    picker.use(pod())
    messages = [body(c, end_of_stream=False) for c in chunks[:-1]] + [body(chunks[-1])]
    answers = await picker.exchange(post_headers(), *messages)
    assert answers[-1].immediate_response.status.code == status


async def test_no_snapshot_under_fail_close_is_503(picker):
    _, answer = await picker.exchange(post_headers(), body(completion("my-model")))
    assert answer.immediate_response.status.code == 503


async def test_a_request_without_body_is_routed_on_its_headers(picker):
    picker.use(pod(5), pod(0))
    [answer] = await picker.exchange(headers((":method", "GET"), (":path", "/health"), end_of_stream=True))
    assert answer.request_headers.response.clear_route_cache
    assert set_headers(answer, "request_headers") == {DEST: "192.168.1.2:8000"}
    assert metadata(answer)["envoy.lb"] == {DEST: "192.168.1.2:8000"}


async def test_response_phase_messages_get_empty_replies(picker):
    picker.use(pod())
    answers = await picker.exchange(
        post_headers(),
        body(completion("my-model")),
        pb.ProcessingRequest(response_headers=pb.HttpHeaders()),
        pb.ProcessingRequest(response_body=pb.HttpBody(body=b"{}", end_of_stream=True)),
    )
    assert [a.WhichOneof("response") for a in answers] == [
        "request_headers",
        "request_body",
        "response_headers",
        "response_body",
    ]
    assert answers[2] == pb.ProcessingResponse(response_headers=pb.HeadersResponse())


async def test_a_streamed_response_gets_an_empty_reply_per_chunk_and_its_usage_counted(picker):
    picker.use(pod())
    events = [b'data: {"choices":[{"text":"a"}]}\n\n'] * 3 + [
        b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\n',
        b"data: [DONE]\n\n",
    ]
    event_stream = base_pb2.HeaderMap(
        headers=[
            base_pb2.HeaderValue(key=":status", raw_value=b"200"),
            base_pb2.HeaderValue(key="content-type", raw_value=b"text/event-stream"),
        ]
    )
    answers = await picker.exchange(
        post_headers(),
        body(completion("my-model")),
        pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=event_stream)),
        *(pb.ProcessingRequest(response_body=pb.HttpBody(body=event)) for event in events),
        pb.ProcessingRequest(response_body=pb.HttpBody(end_of_stream=True)),
    )
    assert answers[3:] == [pb.ProcessingResponse(response_body=pb.BodyResponse())] * (len(events) + 1)
    await eventually(lambda: picker.app.service.open_streams == 0)
    url = f"http://127.0.0.1:{picker.app.metrics_port}/metrics"
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    labels = '{model_name="my-model",target_model_name="my-model-12345"}'
    assert f"inference_objective_output_tokens_sum{labels} 3.0" in text
    assert f"inference_objective_response_sizes_sum{labels} {float(sum(map(len, events)))}" in text


async def test_the_request_id_is_on_the_streams_log_lines(picker, caplog):
    caplog.set_level(logging.INFO, logger="pointsman_picker")
    picker.use(pod())
    await picker.exchange(post_headers(("x-request-id", "rid-7")), body(b"nope"))
    lines = [r.getMessage() for r in caplog.records if r.name == "pointsman_picker.stream"]
    assert lines
    assert all(line.startswith("[rid-7] ") for line in lines)


async def check(port: int, service: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service)
        )
        return response.status


async def eventually_serving(port: int, service: str) -> None:
    for _ in range(200):
        if await check(port, service) == SERVING:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never SERVING")


@pytest.mark.parametrize("service", READINESS_SERVICES)
async def test_readiness_waits_for_the_first_fresh_snapshot_on_both_ports(picker, service):
    for port in (picker.app.port, picker.app.health_port):
        assert await check(port, service) == NOT_SERVING
        assert await check(port, LIVENESS) == SERVING  # live while waiting: no restart for it
    picker.source.set(snapshot(pod(), published_at=NOW - 60))  # a snapshot, but too old to route by
    await asyncio.sleep(0.15)
    assert await check(picker.app.port, service) == NOT_SERVING
    picker.use(pod())
    for port in (picker.app.port, picker.app.health_port):
        await eventually_serving(port, service)


async def test_health_watch_streams_changes_on_both_ports(picker):
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{picker.app.port}") as ext_proc_channel,
        grpc.aio.insecure_channel(f"127.0.0.1:{picker.app.health_port}") as health_channel,
    ):
        watches = [
            health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service="readiness"))
            for channel in (ext_proc_channel, health_channel)
        ]
        for watch in watches:
            assert (await watch.read()).status == NOT_SERVING
        picker.use(pod())
        for watch in watches:
            assert (await asyncio.wait_for(watch.read(), 5)).status == SERVING
        for watch in watches:
            watch.cancel()


async def test_get_v1_models_lists_the_names_clients_send(picker):
    [answer] = await picker.exchange(headers((":method", "GET"), (":path", "/v1/models"), end_of_stream=True))
    listing = json.loads(answer.immediate_response.body)
    assert [m["id"] for m in listing["data"]] == ["my-model", "sql-lora", "sql-lora-sheddable", "plain"]
    assert listing["object"] == "list"


async def test_metrics_are_served(picker):
    picker.use(pod())
    await picker.exchange(post_headers(), body(completion("my-model")))
    await picker.exchange(post_headers(), body(b'{"model":"unknown-model"}'))
    await eventually(lambda: picker.app.service.open_streams == 0)  # both streams closed on the server too
    url = f"http://127.0.0.1:{picker.app.metrics_port}/metrics"
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    assert (
        'inference_model_request_total{model_name="my-model",target_model_name="my-model-12345"} 1.0' in text
    )
    assert (
        'inference_model_request_error_total{error_code="BadConfiguration",model_name="",'
        'target_model_name=""} 1.0' in text
    )
    assert 'pointsman_picker_decisions_total{profile="default",result="picked"} 1.0' in text
    assert 'pointsman_picker_decisions_total{profile="default",result="unknown_model"} 1.0' in text
    assert "inference_extension_scheduler_e2e_duration_seconds_count 1.0" in text
    assert 'pointsman_picker_snapshot_version{name="test-pool"} 1.0' in text
    assert 'inference_pool_ready_pods{name="test-pool"} 1.0' in text
    # Routed and then finished (the stream closed): no longer running.
    assert 'inference_objective_running_requests{model_name="my-model"} 0.0' in text
    assert "pointsman_picker_open_streams 0.0" in text
    [tasks] = [line for line in text.splitlines() if line.startswith("pointsman_picker_event_loop_tasks ")]
    assert float(tasks.split()[1]) >= 1  # the metrics server's own handler, at least


async def test_shutdown_goes_not_serving_and_cancels_streams_after_the_grace(picker):
    picker.use(pod())
    await eventually_serving(picker.app.health_port, "")
    queue: asyncio.Queue[pb.ProcessingRequest | None] = asyncio.Queue()

    async def requests():
        while (message := await queue.get()) is not None:
            yield message

    call = picker.stub.Process(requests())
    await queue.put(post_headers())
    first = await call.read()  # the stream is open, waiting for a body that never comes
    assert first.WhichOneof("response") == "request_headers"
    assert picker.app.service.open_streams == 1
    await picker.app.stop(0.2)
    assert picker.app.service.open_streams == 0
    assert picker.app.service.unfinished_streams == 1
    with pytest.raises(grpc.aio.AioRpcError):
        await call.read()
    await queue.put(None)


async def test_streams_reset_before_shutdown_are_not_counted_as_cut_short(picker):
    # Envoy resets most streams once their exchange is over, and any stream whose client went away:
    # none of that is a stream cut short at shutdown.
    picker.use(pod())
    await eventually_serving(picker.app.health_port, "")
    for finished in [True, False] * 10:
        queue: asyncio.Queue[pb.ProcessingRequest] = asyncio.Queue()

        async def requests(queue: asyncio.Queue[pb.ProcessingRequest] = queue):
            while True:
                yield await queue.get()

        call = picker.stub.Process(requests())
        await queue.put(post_headers())
        await call.read()
        if finished:  # routed and answered, then reset (as Envoy ends a stream)
            await queue.put(body(completion("my-model")))
            await call.read()
        call.cancel()  # else reset while the body is still due (the client went away)
    await eventually(lambda: picker.app.service.open_streams == 0)
    await picker.app.stop(0.2)
    assert picker.app.service.unfinished_streams == 0


def access_log_call(picker: Picker) -> grpc.aio.StreamUnaryMultiCallable:
    return picker.channel.stream_unary(
        "/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs",
        request_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString(),
        response_deserializer=als_pb2.StreamAccessLogsResponse.FromString,
    )


def log_entry(
    message: als_pb2.StreamAccessLogsMessage, route: dict, usage: dict | None, body_bytes: int
) -> None:
    entry = message.http_logs.log_entry.add()
    entry.common_properties.metadata.filter_metadata["pointsman.route"].update(route)
    if usage is not None:
        entry.common_properties.metadata.filter_metadata["pointsman.usage"].update(usage)
    entry.response.response_body_bytes = body_bytes


async def test_the_access_log_records_sizes_and_tokens_and_counts_what_it_drops(picker):
    message = als_pb2.StreamAccessLogsMessage()
    message.identifier.log_name = "pointsman"
    route = {"model": "sql-lora", "target": "sql-lora"}
    log_entry(message, route, {"prompt_tokens": 11, "completion_tokens": 5}, 275)
    log_entry(message, route, None, 100)  # a stream whose client asked no usage
    log_entry(message, {"model": 1, "target": "x"}, None, 1)
    message.http_logs.log_entry.add()  # not routed by a picker
    answer = await access_log_call(picker)(iter([b"\xff\xff", message]))
    assert answer == als_pb2.StreamAccessLogsResponse()
    registry = picker.app.registry
    labels = {"model_name": "sql-lora", "target_model_name": "sql-lora"}
    assert registry.get_sample_value("inference_model_response_sizes_sum", labels) == 375
    assert registry.get_sample_value("inference_model_output_tokens_sum", labels) == 5
    assert registry.get_sample_value("inference_objective_input_tokens_count", labels) == 1
    counts = {
        result: registry.get_sample_value("pointsman_picker_access_log_entries_total", {"result": result})
        for result in ("recorded", "unrouted", "malformed", "dropped")
    }
    assert counts == {"recorded": 2, "unrouted": 1, "malformed": 1, "dropped": 1}


async def test_shutdown_ends_the_access_log_streams_at_once(picker):
    queue: asyncio.Queue[als_pb2.StreamAccessLogsMessage | None] = asyncio.Queue()

    async def messages():
        while (message := await queue.get()) is not None:
            yield message

    call = access_log_call(picker)(messages())
    await queue.put(als_pb2.StreamAccessLogsMessage())
    await eventually(lambda: picker.app.access_log.open_calls == 1)
    started = asyncio.get_running_loop().time()
    await picker.app.stop(5.0)  # Envoy never ends its stream: the grace must not be spent waiting
    assert asyncio.get_running_loop().time() - started < 4.0
    assert picker.app.access_log.open_calls == 0
    assert await call == als_pb2.StreamAccessLogsResponse()  # ended by the picker, with OK
    await queue.put(None)


async def test_an_access_log_stream_opened_during_shutdown_ends_after_its_first_message(picker):
    picker.app.access_log.shutting_down()  # as stop() does, before the GOAWAY reaches Envoy
    message = als_pb2.StreamAccessLogsMessage()
    log_entry(message, {"model": "sql-lora", "target": "sql-lora"}, None, 10)
    queue: asyncio.Queue[als_pb2.StreamAccessLogsMessage | None] = asyncio.Queue()

    async def messages():
        while (found := await queue.get()) is not None:
            yield found

    call = access_log_call(picker)(messages())
    await queue.put(message)
    assert await call == als_pb2.StreamAccessLogsResponse()  # read, then ended by the picker
    assert picker.app.access_log.open_calls == 0
    value = picker.app.registry.get_sample_value
    assert value("pointsman_picker_access_log_entries_total", {"result": "recorded"}) == 1
    await queue.put(None)
