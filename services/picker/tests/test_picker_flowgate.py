"""Flow control through the real servers (native and grpcio on port 0, a real gRPC client): a request
the saturated pool cannot take waits on its stream (Envoy told to wait: override_message_timeout),
is routed when room frees, leaves the queue when its client goes away, gets a 503 when the picker
stops; the metrics count it under upstream's names."""

from __future__ import annotations

import asyncio
import json
import random

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from picker_builders import (
    NOW,
    body,
    config,
    on_free_ports,
    pod,
    pool_pods,
    post_headers,
    set_headers,
    snapshot,
)
from prometheus_client import CollectorRegistry

from pointsman_picker.server import create_app
from pointsman_picker.snapshots import StaticSnapshotSource
from pointsman_testkit import eventually

DEST = "x-gateway-destination-endpoint"
BODY = b'{"model":"my-model","prompt":"hi"}'
FULL = (pod(5), pod(5))  # queueThresholdCritical 5: both saturated
FREE = (pod(5), pod(0))
LATER = NOW + 1.0


@pytest.fixture(params=["native", "grpcio"])
async def picker(request):
    source = StaticSnapshotSource(snapshot(*pool_pods(*FULL)))
    registry = CollectorRegistry()
    cfg = on_free_ports(
        config(
            picker={"server": request.param},
            flowControl={"enabled": True, "defaultRequestTTL": "20s", "maxMessageTimeout": "10s"},
        )
    )
    # A second after the pods' scrape: the picker's assignments are not in their numbers yet.
    clock = [LATER]
    app = create_app(cfg, source=source, registry=registry, rng=random.Random(0), clock=lambda: clock[0])
    await app.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.port}")
    try:
        yield app, source, pb_grpc.ExternalProcessorStub(channel), registry, clock
    finally:
        # Bounded: a hang in teardown fails the test instead of stalling the run.
        await asyncio.wait_for(channel.close(), 5)
        await asyncio.wait_for(app.stop(0), 5)


async def held(stub, *extra, extended=10.0):
    """A stream whose request waits: the call, after the header answer and Envoy's extended timeout
    (``extended``: the fixture's 20s limit plus 1, capped at its maxMessageTimeout)."""
    call = stub.Process()
    await call.write(post_headers(*extra))
    await call.write(body(BODY))
    first = await call.read()
    assert first.HasField("request_headers")
    extend = await call.read()
    assert extend.WhichOneof("response") is None
    assert extend.override_message_timeout.ToTimedelta().total_seconds() == extended
    return call


async def test_a_held_request_is_routed_when_room_frees(picker):
    app, source, stub, registry, _clock = picker
    call = await held(stub)
    assert app.flow.controller.waiting == 1
    source.set(snapshot(*pool_pods(*FREE), version=2))
    routed = await asyncio.wait_for(call.read(), 5)
    assert set_headers(routed)[DEST] == "192.168.1.2:8000"
    assert app.flow.controller.waiting == 0
    await call.done_writing()
    labels = {"priority": "0", "fairness_id": "default-flow", "outcome": "Dispatched"}
    count = "inference_extension_flow_control_request_queue_duration_seconds_count"
    assert registry.get_sample_value(count, labels) == 1


async def test_requests_wait_by_flow_and_are_served_in_turn(picker):
    app, source, stub, registry, clock = picker
    tenant = "x-gateway-inference-fairness-id"
    calls = [await asyncio.wait_for(held(stub, (tenant, "loud")), 3) for _ in range(2)]
    calls += [await asyncio.wait_for(held(stub, (tenant, "quiet")), 3)]
    size = "inference_extension_flow_control_queue_size"
    pool = {"inference_pool": "test-pool", "priority": "0"}
    assert registry.get_sample_value(size, {**pool, "fairness_id": "loud"}) == 2
    assert registry.get_sample_value(size, {**pool, "fairness_id": "quiet"}) == 1
    # One slot: the first loud one; it fills the slot (counted until a scrape shows it).
    source.set(snapshot(*pool_pods(pod(5), pod(4)), version=2))
    await asyncio.wait_for(calls[0].read(), 5)
    assert app.flow.controller.waiting == 2
    # One more slot, scraped after that assignment: the flows take turns, so the quiet one goes next.
    clock[0] = LATER + 0.5
    scraped = snapshot(*pool_pods(pod(5, updated_at=LATER + 0.1), pod(4, updated_at=LATER + 0.1)), version=3)
    source.set(scraped)
    await asyncio.wait_for(calls[2].read(), 5)
    assert app.flow.controller.waiting == 1
    assert registry.get_sample_value(size, {**pool, "fairness_id": "loud"}) == 1
    for call in calls:
        call.cancel()


async def test_a_client_that_goes_away_leaves_the_queue(picker):
    app, _source, stub, registry, _clock = picker
    call = await held(stub)
    call.cancel()
    await eventually(lambda: app.flow.controller.waiting == 0)
    labels = {"priority": "0", "fairness_id": "default-flow", "outcome": "EvictedContextCancelled"}
    count = "inference_extension_flow_control_request_queue_duration_seconds_count"
    await eventually(lambda: registry.get_sample_value(count, labels) == 1)


async def test_a_stopping_picker_answers_every_waiting_request(picker):
    app, _source, stub, _registry, _clock = picker
    calls = [await held(stub) for _ in range(3)]
    stopping = asyncio.create_task(app.stop(1.0))
    for call in calls:
        answer = await asyncio.wait_for(call.read(), 5)
        assert answer.immediate_response.status.code == 503
        assert json.loads(answer.immediate_response.body)["error"]["code"] == 503
    await stopping


async def test_a_full_queue_refuses_at_once():
    source = StaticSnapshotSource(snapshot(*pool_pods(*FULL)))
    cfg = on_free_ports(config(flowControl={"enabled": True, "maxRequests": 1}))
    app = create_app(
        cfg, source=source, registry=CollectorRegistry(), rng=random.Random(0), clock=lambda: NOW
    )
    await app.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)
            first = await held(stub, extended=31.0)  # the default limit, 30s, plus 1
            answers = [r async for r in stub.Process(iter([post_headers(), body(BODY)]))]
            assert answers[-1].immediate_response.status.code == 429
            first.cancel()
    finally:
        await app.stop(0)


def test_off_by_default():
    app = create_app(config(), source=StaticSnapshotSource(), registry=CollectorRegistry())
    assert app.flow is None
    assert isinstance(pb.ProcessingResponse(), pb.ProcessingResponse)
