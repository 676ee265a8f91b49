"""The flow controller with a real director: hold while saturated, dispatch in order as room frees,
bounds, expiry (429 sheddable, 503 the rest), cancellation, drain; and a property: no request is lost
or answered twice."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from picker_builders import NOW, config, ctx, pod, snapshot

from pointsman_picker import errors
from pointsman_picker.director import Director
from pointsman_picker.flowcontrol.controller import FlowController, Waiting
from pointsman_picker.flowcontrol.waits import DEVIATIONS
from pointsman_picker.interfaces import NoMetrics
from pointsman_picker.routing import Routing
from pointsman_picker.snapshots import StaticSnapshotSource

CRITICAL = b'{"model":"my-model","prompt":"hi"}'
SHEDDABLE = b'{"model":"sql-lora-sheddable","prompt":"hi"}'
PODS = ("10.0.0.1:8000", "10.0.0.2:8000")


class Clock:
    def __init__(self) -> None:
        self.now = NOW + 1.0

    def __call__(self) -> float:
        return self.now


class Harness:
    """A controller over two pods whose waiting counts the test sets; answers kept by request id."""

    def __init__(self, metrics: Any = None, **flow: Any) -> None:
        self.clock = Clock()
        self.source = StaticSnapshotSource()
        self.version = 0
        self.set_waiting(0, 0)
        cfg = config(flowControl={"enabled": True, "saturationDetector": {"queueDepthThreshold": 2}, **flow})
        self.director = Director(
            cfg, self.source, NoMetrics(), rng=random.Random(1), clock=self.clock, timer=time.perf_counter
        )
        self.flow = FlowController(self.director, cfg, clock=self.clock, metrics=metrics)
        self.answers: dict[str, list[Routing | errors.PickerError]] = {}
        # Per answered held request: when, and its pod's expected wait then (a routing's).
        self.answered_at: dict[str, tuple[float, float | None]] = {}
        self.held: dict[str, Waiting] = {}
        self.order: list[str] = []  # held requests, as they were answered

    def set_waiting(self, *waiting: int) -> None:
        """A new snapshot, scraped a millisecond from now: the pods' own counts (assignments until now
        are seen); the clock moves on another, so the next assignments are not."""
        self.version += 1
        self.clock.now += 0.001
        now = self.clock.now
        self.clock.now += 0.001
        pods = [pod(w, address=a, updated_at=now) for w, a in zip(waiting, PODS, strict=True)]
        self.source.set(snapshot(*pods, version=self.version, published_at=now))

    def send(self, request_id: str, body: bytes = CRITICAL, flow: str | None = None) -> Routing | Waiting:
        headers = {"x-gateway-inference-fairness-id": flow} if flow else {}
        result = self.flow.route(ctx(body, headers=headers, request_id=request_id))
        if isinstance(result, Waiting):
            self.held[request_id] = result
            result.answer = lambda answer, rid=request_id: self._answer(rid, answer)
        else:
            self.answers.setdefault(request_id, []).append(result)
        return result

    def _answer(self, request_id: str, answer: Routing | errors.PickerError) -> None:
        expected = self.flow.waits.expected(answer.endpoint) if isinstance(answer, Routing) else None
        self.answered_at[request_id] = (self.clock.now, expected)
        self.answers.setdefault(request_id, []).append(answer)
        self.order.append(request_id)

    def dispatched(self) -> list[str]:
        return [rid for rid in self.order if isinstance(self.answers[rid][0], Routing)]


def test_placed_at_once_while_the_pool_has_room():
    h = Harness()
    for i in range(4):  # two pods, room for two each (their own assignments counted)
        assert isinstance(h.send(f"r{i}"), Routing)
    assert isinstance(h.send("r4"), Waiting)
    assert h.flow.waiting == 1


def test_held_requests_go_when_room_frees_one_slot_at_a_time():
    h = Harness()
    h.set_waiting(2, 2)
    for i in range(3):
        assert isinstance(h.send(f"r{i}"), Waiting)
    assert h.flow.pump() == 0
    h.set_waiting(1, 2)  # one slot frees
    h.clock.now += 0.05
    assert h.flow.pump() == 1
    [routing] = h.answers["r0"]
    assert isinstance(routing, Routing)
    assert routing.endpoint == PODS[0]
    assert h.flow.pump() == 0  # the dispatched one fills the slot
    h.set_waiting(0, 0)
    h.clock.now += 0.05
    assert h.flow.pump() == 2
    assert h.dispatched() == ["r0", "r1", "r2"]


def test_a_new_request_waits_behind_those_already_waiting():
    h = Harness()
    h.set_waiting(2, 2)
    h.send("first")
    h.set_waiting(0, 2)
    assert isinstance(h.send("second"), Waiting)  # room, but "first" goes first
    h.flow.pump()
    assert h.dispatched() == ["first", "second"]


def test_bands_then_flows_in_turn():
    h = Harness(priorityBands=[{"priority": 0}, {"priority": -1}])
    h.set_waiting(2, 2)
    h.send("shed", SHEDDABLE, flow="quiet")
    for i in range(3):
        h.send(f"loud{i}", flow="loud")
    h.send("quiet0", flow="quiet")
    h.set_waiting(0, 0)
    h.clock.now += 0.05
    h.flow.pump()
    assert h.dispatched() == ["loud0", "quiet0", "loud1", "loud2"]
    h.set_waiting(0, 0)
    h.clock.now += 0.05
    h.flow.pump()
    assert h.dispatched()[-1] == "shed"


# The sheddable band saturates at one waiting request per pod, the critical one at two (the pool's).
SHEDDABLE_BAND = [{"priority": -1, "saturationDetector": {"queueDepthThreshold": 1}}]


def test_a_band_with_its_own_thresholds_waits_while_a_higher_one_goes_on():
    h = Harness(priorityBands=SHEDDABLE_BAND)
    h.set_waiting(1, 1)
    assert isinstance(h.send("shed", SHEDDABLE), Waiting)
    assert isinstance(h.send("critical"), Routing)  # nothing of its band or higher waits; room for it
    h.set_waiting(0, 1)
    h.clock.now += 0.05
    assert h.flow.pump() == 1
    assert h.dispatched() == ["shed"]


def test_a_request_the_profile_drops_is_dropped_at_once_not_held():
    # The pool has room for the detector (100 per pod), but the #423 tree drops a sheddable request
    # when every pod has more than 5 waiting.
    h = Harness(priorityBands=[{"priority": -1, "saturationDetector": {"queueDepthThreshold": 100}}])
    h.set_waiting(6, 6)
    with pytest.raises(errors.NoCapacity) as raised:
        h.send("shed", SHEDDABLE)
    assert raised.value.status == 429
    assert h.flow.waiting == 0


def test_a_held_request_the_profile_drops_at_dispatch_is_answered_with_429():
    h = Harness(priorityBands=[{"priority": -1, "saturationDetector": {"queueDepthThreshold": 100}}])
    h.set_waiting(100, 100)
    assert isinstance(h.send("shed", SHEDDABLE), Waiting)
    h.set_waiting(6, 6)  # room for the detector, none for the profile
    h.clock.now += 0.05
    assert h.flow.pump() == 1
    [answer] = h.answers["shed"]
    assert isinstance(answer, errors.NoCapacity)
    assert answer.status == 429


ADAPTER = b'{"model":"sql-lora","prompt":"hi"}'
ADAPTER_TARGET = "sql-lora-1fdg2"


def adapter_on_second(h: Harness, first: int, second: int) -> None:
    """A snapshot where the second pod runs sql-lora's adapter (one slot): the #423 tree sends a
    Critical sql-lora request there while it has fewer than 128 waiting."""
    now = h.clock.now
    pods = [
        pod(first, address=PODS[0], updated_at=now),
        pod(second, 0.1, 1, [ADAPTER_TARGET], address=PODS[1], updated_at=now),
    ]
    h.version += 1
    h.source.set(snapshot(*pods, version=h.version, published_at=now))
    h.clock.now += 0.001


def test_a_pick_on_a_pod_without_room_waits_at_the_gateway_until_that_pod_has_room():
    h = Harness()
    adapter_on_second(h, 0, 2)  # the first pod has room, the adapter's has none
    held = h.flow.route(ctx(ADAPTER, request_id="a"))
    assert isinstance(held, Waiting)
    assert held.reason == f"its pod {PODS[1]} has no room"
    held.answer = lambda answer: h.answers.setdefault("a", []).append(answer)
    assert h.flow.pump() == 0
    adapter_on_second(h, 0, 1)
    assert h.flow.pump() == 1
    [routing] = h.answers["a"]
    assert isinstance(routing, Routing)
    assert routing.endpoint == PODS[1]


def test_a_request_whose_pod_is_full_does_not_hold_those_behind_it():
    h = Harness()
    h.set_waiting(2, 2)
    h.send("adapter", ADAPTER)
    h.send("base")
    h.send("adapter2", ADAPTER)
    adapter_on_second(h, 0, 2)
    assert h.flow.pump() == 1
    assert h.dispatched() == ["base"]  # to the first pod; both sql-lora ones keep their places
    assert h.answers["base"][0].endpoint == PODS[0]  # type: ignore[union-attr]
    adapter_on_second(h, 0, 0)
    h.flow.pump()
    assert h.dispatched() == ["base", "adapter", "adapter2"]


def test_a_pick_with_room_stands():
    h = Harness()
    h.source.set(
        snapshot(
            pod(0, address=PODS[0], updated_at=h.clock.now),
            pod(1, 0.1, 1, [ADAPTER_TARGET], address=PODS[1], updated_at=h.clock.now),
            version=99,
            published_at=h.clock.now,
        )
    )
    h.clock.now += 0.001
    routing = h.flow.route(ctx(ADAPTER))
    assert isinstance(routing, Routing)
    assert routing.endpoint == PODS[1]  # its adapter's pod, which has room: the profile's pick


@pytest.mark.parametrize(("body", "status"), [(SHEDDABLE, 429), (CRITICAL, 503)])
def test_expiry(body, status):
    h = Harness(defaultRequestTTL="2s")
    h.set_waiting(2, 2)
    h.send("r", body)
    h.clock.now += 1.9
    h.flow.pump()
    assert "r" not in h.answers
    h.clock.now += 0.2
    h.flow.pump()
    [error] = h.answers["r"]
    assert isinstance(error, errors.PickerError)
    assert error.status == status
    assert error.result == "queue_expired"


def test_a_full_band_refuses_at_once_with_429():
    h = Harness(priorityBands=[{"priority": 0, "maxRequests": 1}])
    h.set_waiting(2, 2)
    h.send("r0")
    with pytest.raises(errors.QueueFull) as raised:
        h.send("r1")
    assert raised.value.status == 429


def test_a_cancelled_request_is_never_answered():
    h = Harness()
    h.set_waiting(2, 2)
    h.send("gone")
    h.send("kept")
    h.held["gone"].cancel()
    assert h.flow.waiting == 1
    h.set_waiting(0, 0)
    h.clock.now += 0.05
    h.flow.pump()
    assert "gone" not in h.answers
    assert "kept" in h.answers


def test_drain_answers_every_waiting_request_then_places_at_once():
    h = Harness()
    h.set_waiting(2, 2)
    h.send("a")
    h.send("b")
    assert h.flow.drain() == 2
    assert [h.answers[r][0].status for r in ("a", "b")] == [503, 503]  # type: ignore[union-attr]
    assert isinstance(h.send("late"), Routing)  # stopping: nothing waits any more


def test_the_explanation_says_how_long_it_waited_and_why():
    h = Harness(priorityBands=[{"priority": 0}, {"priority": -1, "requestTTL": "1s"}])
    h.set_waiting(2, 2)
    first = h.flow.route(ctx(CRITICAL, explain=True, request_id="x"))
    second = h.flow.route(
        ctx(CRITICAL, explain=True, request_id="y", headers={"x-gateway-inference-fairness-id": "t"})
    )
    shed = h.flow.route(ctx(SHEDDABLE, explain=True, request_id="z"))
    assert isinstance(first, Waiting)
    assert isinstance(second, Waiting)
    assert isinstance(shed, Waiting)
    got: list[Any] = []
    first.answer = second.answer = shed.answer = got.append
    h.clock.now += 0.25
    h.set_waiting(1, 1)  # room for two
    h.flow.pump()
    assert [r.explain.split(";")[0] for r in got[:2]] == [
        "waited 0.252s in flow control (priority 0, flow default-flow): pool saturated",
        "waited 0.252s in flow control (priority 0, flow t): 1 waiting before it",
    ]
    assert all(isinstance(r, Routing) for r in got[:2])
    h.clock.now += 1.0  # the sheddable one, behind a full pool, expires
    h.flow.pump()
    assert isinstance(got[2], errors.ShedExpired)
    assert (
        got[2].explain
        == "waited 1.252s in flow control (priority -1, flow default-flow): 2 waiting before it"
    )


class Outcomes:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def waited(self, priority: int, flow: str, outcome: str, seconds: float) -> None:
        self.seen.append(outcome)


# One observation R: mean R, deviation R/2, expected R + DEVIATIONS * R/2 = 0.6 s.
R = 0.6 / (1 + DEVIATIONS / 2)


# flowControl.dispatchDeadline: a held request waited `waited` of its 2 s, then room frees on both pods,
# whose measured waits (dispatch to response headers) are `observed`: sent, or answered as expired.
@pytest.mark.parametrize(
    ("deadline", "observed", "body", "waited", "answer"),
    [
        # One observation each: expected 0.6 s.
        pytest.param({}, (R, R), CRITICAL, 1.3, "sent", id="its pod answers in time: sent"),
        pytest.param({}, (R, R), CRITICAL, 1.5, 503, id="critical, would be late: 503"),
        pytest.param({}, (R, R), SHEDDABLE, 1.5, 429, id="sheddable, would be late: 429"),
        pytest.param({"enabled": False}, (R, R), CRITICAL, 1.5, "sent", id="off: sent to be late"),
        pytest.param({}, (None, R), CRITICAL, 1.5, 503, id="a pod not measured: the pool's wait"),
        pytest.param({}, (None, None), CRITICAL, 1.45, "sent", id="nothing measured: the default 0.5 s"),
        pytest.param({}, (None, None), CRITICAL, 1.55, 503, id="nothing measured, past the default"),
        pytest.param(
            {"defaultWait": "0s"}, (None, None), CRITICAL, 1.99, "sent", id="default 0: sent while any left"
        ),
    ],
)
def test_a_held_request_its_pod_would_answer_too_late_is_answered_as_expired(
    deadline, observed, body, waited, answer
):
    outcomes = Outcomes()
    h = Harness(outcomes, defaultRequestTTL="2s", dispatchDeadline=deadline)
    for address, seconds in zip(PODS, observed, strict=True):
        if seconds is not None:
            h.flow.waits.observe(address, seconds)
    h.set_waiting(2, 2)
    h.send("r", body)
    h.clock.now += waited - 0.002  # set_waiting moves the clock 2 ms
    h.set_waiting(0, 0)
    h.flow.pump()
    [got] = h.answers["r"]
    assert h.flow.waiting == 0
    if answer == "sent":
        assert isinstance(got, Routing)
        assert outcomes.seen == ["Dispatched"]
    else:
        assert isinstance(got, errors.PickerError)
        assert (got.status, got.result) == (answer, "queue_expired")
        assert outcomes.seen == ["EvictedTTL"]


def test_a_late_requests_explanation_names_its_pod_and_the_waits():
    h = Harness(defaultRequestTTL="2s")
    for address in PODS:
        h.flow.waits.observe(address, R)
    h.set_waiting(2, 2)
    waiting = h.flow.route(ctx(CRITICAL, explain=True, request_id="x"))
    assert isinstance(waiting, Waiting)
    got: list[Any] = []
    waiting.answer = got.append
    h.clock.now += 1.5
    h.set_waiting(0, 0)
    h.flow.pump()
    [error] = got
    assert isinstance(error, errors.QueueExpired)
    why, late = error.explain.split("; ")
    assert why == "waited 1.502s in flow control (priority 0, flow default-flow): pool saturated"
    assert late.startswith("not dispatched: its pod 10.0.0.")
    assert late.endswith(" is expected to start answering in 0.600s, 0.498s of its limit left")


def test_a_response_measures_its_pods_wait_from_the_decision():
    h = Harness()
    routing = h.send("r")
    assert isinstance(routing, Routing)
    h.clock.now += R
    h.flow.responded(routing)
    assert h.flow.waits.expected(routing.endpoint) == pytest.approx(0.6)


def test_a_request_placed_at_once_is_not_held_back_by_its_pods_wait():
    h = Harness(defaultRequestTTL="1s")
    for address in PODS:
        h.flow.waits.observe(address, 5.0)  # expected 10 s, past any limit
    assert isinstance(h.send("r"), Routing)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.booleans(), st.sampled_from(["a", "b", "c"])),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(st.just("tick"), st.floats(0.0, 1.5)),
        st.tuples(st.just("free"), st.integers(0, 3), st.integers(0, 3)),
        st.tuples(st.just("end"), st.integers(0, 50)),
        st.tuples(st.just("respond"), st.integers(0, 50), st.floats(0.0, 0.8)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_no_request_is_lost_or_answered_twice(ops):
    h = Harness(defaultRequestTTL="1s", maxRequests=5, priorityBands=SHEDDABLE_BAND)
    h.set_waiting(2, 2)
    sent: list[str] = []
    sent_at: dict[str, float] = {}
    refused: set[str] = set()
    cancelled: set[str] = set()
    for op in ops:
        if op[0] == "send":
            rid = f"r{len(sent)}"
            sent.append(rid)
            sent_at[rid] = h.clock.now
            try:
                h.send(rid, CRITICAL if op[1] else SHEDDABLE, flow=op[2])
            except errors.PickerError:  # queue full, or no fresh snapshot: answered at once
                refused.add(rid)
        elif op[0] == "cancel" and sent:
            rid = sent[op[1] % len(sent)]
            waiting = h.held.get(rid)
            if waiting is not None and rid not in h.answers:
                waiting.cancel()
                cancelled.add(rid)
        elif op[0] == "tick":
            h.clock.now += op[1]
        elif op[0] == "free":
            h.set_waiting(op[1], op[2])
        elif op[0] == "end" and sent:
            answers = h.answers.get(sent[op[1] % len(sent)], [])
            if answers and isinstance(answers[0], Routing):
                h.flow.finished(answers[0])
        elif op[0] == "respond" and sent:  # its response came op[2] s after its decision
            answers = h.answers.get(sent[op[1] % len(sent)], [])
            if answers and isinstance(answers[0], Routing) and answers[0].ticket is not None:
                h.clock.now += op[2]
                h.flow.responded(answers[0])
        h.flow.pump()
    drained_at = h.clock.now + 1e-6
    h.clock.now = drained_at
    h.flow.drain()
    for rid in sent:
        got = h.answers.get(rid, [])
        if rid in cancelled or rid in refused:
            assert got == []
        else:
            assert len(got) == 1, (rid, got)
        # A held request dispatched (before the drain) was expected to be answered within its 1 s.
        at, expected = h.answered_at.get(rid, (0.0, None))
        if expected is not None and rid in h.held and not h.flow.queue and at < drained_at:
            assert at + expected <= sent_at[rid] + 1.0 + 1e-9, (rid, at, expected)
    assert h.flow.waiting == 0
