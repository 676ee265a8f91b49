"""The benchmark's virtual picker path decides exactly as the live picker does.

One scripted run (pool snapshots every 50 ms, requests between them, requests ending in between) goes
through two paths with the same seed and the same clock values:

- A: :class:`~pointsman_quality.picker_path.DirectorRouter`, as the fleet driver calls it;
- B: the real picker app (``create_app``) on port 0, ``native`` and ``grpcio`` servers, its snapshot a
  :class:`~pointsman_picker.snapshots.StaticSnapshotSource` replaced by hand, driven by a real gRPC
  ext_proc client: one stream per request, closed where path A calls ``finished``.

Every decision (the pod and the model it is sent as, or the error status) must match, for the
``default`` (#423 tree) and ``scorer`` profiles with ``countAssignments`` on.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest
import yaml
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from prometheus_client import CollectorRegistry
from quality_builders import body, metadata, on_free_ports, pod, pool_pods, post_headers, set_headers

from pointsman_picker.server import create_app
from pointsman_picker.snapshots import StaticSnapshotSource
from pointsman_quality.picker_path import DirectorRouter, TwoPickers, prompt_text, request_body
from pointsman_shared.config import PointsmanConfig, parse_config
from pointsman_shared.snapshot import PodSnapshot, PoolSnapshot
from pointsman_sim.fleet import HOLD, Placement, TraceRequest
from pointsman_sim.prefix import Span
from pointsman_sim.prefix import prompt_text as spans_text

DEST = "x-gateway-destination-endpoint"
POOL = "quality-pool"
PROFILES = Path(__file__).resolve().parents[3] / "config" / "profiles"
BASE = "base-model"
SEED = 423
MODELS = [
    {"modelName": BASE, "criticality": "Critical"},
    {
        "modelName": "sql-lora",
        "criticality": "Critical",
        "targetModels": [{"name": "sql-lora-v1", "weight": 3}, {"name": "sql-lora-v2", "weight": 1}],
    },
    {"modelName": "tweet-lora", "criticality": "Sheddable", "targetModels": [{"name": "tweet-lora-v1"}]},
    {
        "modelName": "chat-lora",
        "criticality": "Sheddable",
        "targetModels": [{"name": "chat-lora-a"}, {"name": "chat-lora-b"}],
    },
    {"modelName": "math-lora", "priority": -1},  # an InferenceObjective: sheddable, served as named
]
# What requests ask for: the base model (None), adapters with and without targets, and one no
# InferenceModel names (a 404 on both paths).
ASKED = (None, None, None, "sql-lora", "sql-lora", "tweet-lora", "tweet-lora", "chat-lora", "math-lora")
UNKNOWN = "ghost-lora"
# What pods run or queue: every target, and one no request asks for.
ADAPTERS = ("sql-lora-v1", "sql-lora-v2", "tweet-lora-v1", "chat-lora-a", "chat-lora-b", "math-lora", "x")
PODS = 5
TICK = 0.05
TICKS = 130


def quality_config(profile: str, *, count_assignments: bool = True) -> PointsmanConfig:
    return parse_config(
        {
            "pool": {"name": POOL, "targetPort": 8000},
            "models": MODELS,
            # Below 0.999 the soft-affinity filter's random draw picks the free-slot group now and then.
            "scheduling": {"loraAffinityThreshold": 0.8},
            "picker": {
                "profile": profile,
                "countAssignments": count_assignments,
                "passthroughUnknownModels": False,
            },
        }
    )


# -- the scripted run ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Route:
    index: int
    request: TraceRequest
    pods: tuple[PodSnapshot, ...]  # the newest round of snapshots at the request's arrival


@dataclass(frozen=True, slots=True)
class Finish:
    index: int  # the request that ends (its ext_proc stream closes)


Event = Route | Finish


def pool_round(rng: random.Random, tick: int, now: float) -> tuple[PodSnapshot, ...]:
    """One collector round: load that swells and ebbs (sheddable requests meet full pods), KV in tenths
    (the scorer profile meets ties), adapter slots full and free, the odd stale or unhealthy pod."""
    busy = tick % 40 >= 25
    pods = []
    for i in range(PODS):
        max_lora = rng.choice((0, 1, 2, 4))
        stale = rng.random() < 0.1
        pods.append(
            replace(
                pod(
                    waiting=rng.randrange(4, 20) if busy else rng.randrange(0, 7),
                    kv=rng.randrange(5, 11) / 10 if busy else rng.randrange(0, 9) / 10,
                    max_lora=max_lora,
                    adapters=rng.sample(ADAPTERS, rng.randrange(0, max_lora + 1)),
                    waiting_adapters=rng.sample(ADAPTERS, rng.randrange(0, 2)),
                    updated_at=now - (3.0 if stale else rng.uniform(0.0, TICK)),
                    healthy=rng.random() > 0.05,
                ),
                running=rng.randrange(0, 8),
            )
        )
        if tick % 37 == 20:  # only an unhealthy pod is fresh: every pod is used, stale
            pods[-1] = replace(pods[-1], updated_at=now - 3.0 if i else now, healthy=bool(i))
    return pool_pods(*pods)


def scripted_run(seed: int = 7) -> list[Event]:
    """~300 requests over 130 rounds of snapshots, with a gap in the snapshots (no fresh pool: 503)."""
    rng = random.Random(seed)
    events: list[Event] = []
    in_flight: list[int] = []
    now = 100.0
    pods: tuple[PodSnapshot, ...] = ()
    index = 0
    for tick in range(TICKS):
        if tick % 53 == 40 and pods:
            now += 2.5  # the collector went quiet: the last round is too old to use
        else:
            pods = pool_round(rng, tick, now)
        arrivals = sorted(now + rng.uniform(0.001, TICK - 0.001) for _ in range(rng.randrange(0, 5)))
        for arrival in arrivals:
            adapter = UNKNOWN if rng.random() < 0.04 else rng.choice(ASKED)
            prompt = rng.choice((16, 64, 300, 2000))  # sizes a picker that weighs prompts tells apart
            events.append(Route(index, TraceRequest(arrival, prompt, 16, adapter), pods))
            in_flight.append(index)
            index += 1
            while in_flight and (len(in_flight) > 24 or rng.random() < 0.45):
                events.append(Finish(in_flight.pop(rng.randrange(len(in_flight)))))
        now += TICK
    return events


Decision = tuple[str, str] | int  # (endpoint, the model sent to it) or an HTTP status


# -- path A: the benchmark's router ------------------------------------------------------------------
def virtual_decisions(
    config: PointsmanConfig, events: list[Event], seed: int, *, release: bool = True
) -> list[Decision]:
    router = DirectorRouter(config, BASE, random.Random(seed))
    requests: dict[int, TraceRequest] = {}
    decisions: list[Decision] = []
    for event in events:
        if isinstance(event, Finish):
            if release:
                router.finished(requests.pop(event.index))
            continue
        router.now = event.request.arrival  # as __call__ sets it
        errors = dict(router.errors)
        placement = router(event.request, event.pods)
        requests[event.index] = event.request
        if placement is None:
            [status] = [s for s, n in router.errors.items() if n != errors.get(s, 0)]
            decisions.append(status)
        else:
            assert isinstance(placement, Placement)
            decisions.append((event.pods[placement.pod].address, placement.adapter or BASE))
    return decisions


# -- path B: the live picker over gRPC ---------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def close(call: grpc.aio.StreamStreamCall) -> None:
    """Half-close the stream, as Envoy does when the request ends; the server releases the request
    before it ends the call, so it is released before the next request is routed."""
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert await call.code() is grpc.StatusCode.OK


def live_decision(answer: pb.ProcessingResponse, sent: bytes) -> Decision:
    if answer.HasField("immediate_response"):
        return answer.immediate_response.status.code
    endpoint = set_headers(answer)[DEST]
    # pointsman.route (model, target) comes beside it when Envoy shows the picker no response body.
    assert metadata(answer)["envoy.lb"] == {DEST: endpoint}
    mutation = answer.request_body.response.body_mutation
    forwarded = mutation.body if mutation.HasField("body") else sent
    return endpoint, json.loads(forwarded)["model"]


async def live_decisions(
    config: PointsmanConfig, events: list[Event], seed: int, server: str
) -> list[Decision]:
    picker = config.picker.model_copy(update={"server": server})
    config = on_free_ports(config.model_copy(update={"picker": picker}))
    source = StaticSnapshotSource()
    clock = Clock()
    app = create_app(
        config, source=source, registry=CollectorRegistry(), rng=random.Random(seed), clock=clock
    )
    await app.start()
    decisions: list[Decision] = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)
            streams: dict[int, grpc.aio.StreamStreamCall] = {}
            shown: tuple[PodSnapshot, ...] | None = None
            version = 0
            routed = 0
            for event in events:
                if isinstance(event, Finish):
                    await close(streams.pop(event.index))
                    continue
                if event.pods is not shown:  # a new round: what FleetSnapshots builds from it
                    shown, version = event.pods, version + 1
                    published = max(p.updated_at for p in shown)
                    source.set(PoolSnapshot(POOL, version, published, shown))
                clock.now = event.request.arrival
                call = stub.Process()
                streams[event.index] = call
                routed += 1  # the router numbers its requests, as the prompts of requests without spans say
                sent = request_body(event.request.adapter or BASE, prompt_text(event.request, routed))
                await call.write(post_headers())
                assert (await call.read()).WhichOneof("response") == "request_headers"
                await call.write(body(sent))
                decisions.append(live_decision(await call.read(), sent))
            for call in streams.values():
                await close(call)
    finally:
        await app.stop(0)
    return decisions


# -- the tests -------------------------------------------------------------------------------------------
EVENTS = scripted_run()


def test_the_run_covers_what_the_comparison_needs():
    routes = [e for e in EVENTS if isinstance(e, Route)]
    assert 250 <= len(routes) <= 400
    assert sum(isinstance(e, Finish) for e in EVENTS) > len(routes) // 2
    default = virtual_decisions(quality_config("default"), EVENTS, SEED)
    scorer = virtual_decisions(quality_config("scorer"), EVENTS, SEED)
    for decisions in (default, scorer):
        picked = [d for d in decisions if isinstance(d, tuple)]
        assert len({endpoint for endpoint, _ in picked}) == PODS
        assert {"sql-lora-v1", "sql-lora-v2", "chat-lora-a", "chat-lora-b", BASE} <= {m for _, m in picked}
        assert {404, 503} <= {d for d in decisions if isinstance(d, int)}
    assert 429 in default  # the #423 tree sheds sheddable requests when no pod has room


@pytest.mark.parametrize("profile", ["default", "scorer"])
def test_the_comparison_can_fail(profile):
    """The seed, the assignments counted and their release all change the decisions: a live path that
    drew differently, or released at another point, would not match."""
    config = quality_config(profile)
    decisions = virtual_decisions(config, EVENTS, SEED)
    assert virtual_decisions(config, EVENTS, SEED) == decisions
    assert virtual_decisions(config, EVENTS, SEED + 1) != decisions
    assert virtual_decisions(quality_config(profile, count_assignments=False), EVENTS, SEED) != decisions
    assert virtual_decisions(config, EVENTS, SEED, release=False) != decisions


@pytest.mark.parametrize("server", ["native", "grpcio"])
@pytest.mark.parametrize("profile", ["default", "scorer"])
async def test_the_live_picker_decides_as_the_virtual_path(profile, server):
    config = quality_config(profile)
    virtual = virtual_decisions(config, EVENTS, SEED)
    live = await live_decisions(config, EVENTS, SEED, server)
    assert len(live) == len(virtual)
    mismatches = [(i, v, b) for i, (v, b) in enumerate(zip(virtual, live, strict=True)) if v != b]
    assert not mismatches, (
        f"{len(mismatches)} decisions differ, first (index, virtual, live): {mismatches[0]}"
    )


# -- prompts and two pickers -------------------------------------------------------------------------------
def test_prompt_text_spells_the_spans_and_requests_without_share_nothing() -> None:
    system, a, b = Span(7, 512), Span(8, 64), Span(9, 64)
    one = prompt_text(TraceRequest(0.0, 576, 1, None, (system, a)), 1)
    two = prompt_text(TraceRequest(0.0, 576, 1, None, (system, b)), 2)
    assert len(one) == len(two) == 4 * 576
    assert one[: 4 * 512] == two[: 4 * 512]
    assert one[4 * 512 :] != two[4 * 512 :]
    shorter = TraceRequest(0.0, 500, 76, None, (system, a))  # spans reaching into the output
    assert prompt_text(shorter, 1) == one[:2000]
    plain = [prompt_text(TraceRequest(0.0, 100, 1, None), n) for n in (1, 2)]
    assert len(plain[0]) == 400
    assert plain[0][:16] != plain[1][:16]


def prefix_config() -> PointsmanConfig:
    doc = yaml.safe_load((PROFILES / "prefix-only.yaml").read_text(encoding="utf-8"))
    return parse_config({**doc, "pool": {"name": POOL}, "models": [{"modelName": BASE}]})


@pytest.mark.parametrize("shared", [True, False])
def test_two_pickers_share_their_prefix_index_after_the_delay(shared: bool) -> None:
    pods = tuple(pod(address=f"10.0.0.{i}:8000") for i in range(1, 5))
    router = TwoPickers(prefix_config(), BASE, random.Random(5), shared=shared, delay=0.06)
    system = Span(1, 1024)
    chosen = []
    for i in range(40):
        request = TraceRequest(i * 0.1, 1088, 1, None, (system, Span(100 + i, 64)))
        placement = router(request, pods)
        assert placement is not None
        chosen.append(placement.pod)
        router.finished(request)
    # One index: every request after the first goes where the system prompt is. Two apart: each
    # picker's first request picks at random (with this seed, two other pods), then sticks to it.
    if shared:
        assert len(set(chosen)) == 1
    else:
        assert len(set(chosen)) == 2


def test_with_flow_control_a_saturated_pool_holds_and_dispatch_places_later():
    config = quality_config("default").model_copy(
        update={"flow_control": parse_config({"flowControl": {"enabled": True}}).flow_control}
    )
    router = DirectorRouter(config, BASE, random.Random(SEED))
    full = [replace(p, updated_at=0.0) for p in pool_pods(pod(5), pod(5))]
    request = TraceRequest(1.0, 16, 4, None, tenant="quiet", objective=None)
    assert router(request, full) is HOLD
    assert router.dispatch(1.05, full) == []  # still saturated
    free = [replace(p, updated_at=1.1) for p in pool_pods(pod(5), pod(0))]
    [(placed, choice)] = router.dispatch(1.1, free)
    assert placed is request
    assert choice == Placement(1, None)
    router.finished(request)
    assert router.flow is not None
    assert router.flow.waiting == 0


@pytest.mark.parametrize(("share", "expected"), [(False, 2), (True, 1)])
def test_two_pickers_sharing_their_dispatches_take_one_freed_slot_once(share: bool, expected: int) -> None:
    config = quality_config("default").model_copy(
        update={"flow_control": parse_config({"flowControl": {"enabled": True}}).flow_control}
    )
    router = TwoPickers(config, BASE, random.Random(SEED), shared=False, share_dispatches=share)
    full = [replace(p, updated_at=0.0) for p in pool_pods(pod(5), pod(5))]
    requests = [TraceRequest(1.0 + i * 0.001, 16, 4, None, objective=None) for i in range(8)]
    assert all(router(r, full) is HOLD for r in requests)
    assert all(p.flow is not None and p.flow.waiting for p in router.pickers)  # both hold some
    assert router.dispatch(1.05, full) == []  # a snapshot round: still full (the reports go out)
    one_slot = [replace(p, updated_at=1.1) for p in pool_pods(pod(5), pod(4))]
    placed = router.dispatch(1.1, one_slot)
    placed += router.dispatch(1.101, one_slot)  # the next pump, before another scrape
    # Without sharing, each picker sends one request into the one slot.
    assert len(placed) == expected
    assert all(choice == Placement(1, None) for _, choice in placed)


def test_a_request_with_spans_sends_its_prompt_to_the_picker() -> None:
    router = DirectorRouter(quality_config("default"), "base", random.Random(1))
    spans = (Span(1, 64), Span(2, 16))
    body = json.loads(router._body(TraceRequest(0.0, 80, 8, None, spans)))
    assert body["prompt"] == spans_text(spans, 80)
    plain = json.loads(router._body(TraceRequest(0.0, 80, 8, None)))["prompt"]
    assert len(plain) == 320
    assert plain.startswith("request ")
