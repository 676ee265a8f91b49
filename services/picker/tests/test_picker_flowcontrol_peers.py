"""The peers' view: reports round-trip, a report that stops changing is forgotten, the peers'
assignments since a pod's scrape count, the room a scrape shows is split between the pickers with
requests waiting (the shares add up to the room, property), and two flow controllers that exchange
reports dispatch one request, not two, into one freed slot."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from picker_builders import NOW, config, ctx, pod, snapshot

from pointsman_picker.director import Director
from pointsman_picker.flowcontrol.controller import FlowController, Waiting
from pointsman_picker.flowcontrol.peers import MAX_TIMES, PeerView, Report, decode, encode
from pointsman_picker.flowcontrol.saturation import Thresholds, room
from pointsman_picker.interfaces import NoMetrics
from pointsman_picker.routing import Routing
from pointsman_picker.snapshots import StaticSnapshotSource

A, B = "10.0.0.1:8000", "10.0.0.2:8000"
DEPTH = Thresholds(queue_depth=4, kv_cache=0.9)


def report(sequence: int = 1, waiting: int = 0, **dispatches: list[float]) -> Report:
    return Report(sequence, waiting, {A if k == "a" else B: tuple(v) for k, v in dispatches.items()})


def test_a_report_round_trips_and_keeps_the_newest_times():
    times = [NOW + i for i in range(MAX_TIMES + 10)]
    back = decode(encode(7, 3, {A: times, B: []}))
    assert back == Report(7, 3, {A: tuple(times[-MAX_TIMES:])})


@pytest.mark.parametrize("blob", [b"", b"[]", b'{"s": 1}', b'{"s": 1, "w": 0, "p": 3}', b"\xff"])
def test_a_value_that_is_not_a_report_is_refused(blob):
    with pytest.raises(ValueError, match="not a report"):
        decode(blob)


@pytest.mark.parametrize(
    ("pods", "reports", "expected"),
    [
        # no peer: nothing
        ([pod(0, address=A)], {}, {}),
        # a peer with nothing waiting: its assignments after the scrape count, those before do not
        ([pod(0, address=A)], {"p": report(a=[NOW - 1, NOW + 0.1, NOW + 0.2])}, {A: 2}),
        # a peer waiting too: the room (4 on A) is split, 2 each (the peer's 1 sent is less)
        ([pod(0, address=A)], {"p": report(waiting=5, a=[NOW + 0.1])}, {A: 2}),
        # the peer sent more than its share: that counts
        ([pod(0, address=A)], {"p": report(waiting=5, a=[NOW + 0.1] * 3)}, {A: 3}),
        # three pickers waiting, room 3 on a pod: one each
        ([pod(1, address=A)], {"p": report(waiting=1), "q": report(waiting=1)}, {A: 2}),
        # a saturated pod has no room to share
        ([pod(4, address=A)], {"p": report(waiting=5)}, {}),
    ],
)
def test_what_the_peers_take_of_each_pod(pods, reports, expected):
    view = PeerView("me", ttl=1.0)
    view.update(reports, NOW)
    assert view.extra(pods, DEPTH, NOW + 0.3, horizon=5.0) == expected


# A queue depth far above the load, and a pool mean of 10 running + waiting per pod.
MEAN = Thresholds(queue_depth=1000, kv_cache=0.9, pod_requests=10)


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        pytest.param([(0, 0)], {A: 5}, id="idle-pod-half-of-10"),
        pytest.param([(5, 1)], {A: 2}, id="half-of-what-is-left-under-the-mean"),
        # Without the mean the peer's share would be half the queue depth's room (about 500): as
        # waiting requests, past the pool mean of every band.
        pytest.param([(12, 0)], {}, id="past-the-mean-nothing-to-share"),
        # The pool's room under the mean is 6 (B's 4 past it take from A's 10): half of it.
        pytest.param([(0, 0), (14, 0)], {A: 3}, id="the-pool-s-room-not-a-pod-s"),
        pytest.param([(2, 0), (6, 0)], {A: 4, B: 2}, id="spread-by-each-pod-s-room"),
    ],
)
def test_with_a_pool_mean_the_pool_s_room_under_it_is_shared(loads, expected):
    view = PeerView("me", ttl=1.0)
    view.update({"p": report(waiting=5)}, NOW)
    pods = [pod(w, running=r, address=a) for (r, w), a in zip(loads, (A, B), strict=False)]
    assert view.extra(pods, MEAN, NOW + 0.3, horizon=5.0) == expected


def test_assignments_older_than_the_horizon_do_not_count():
    view = PeerView("me")
    view.update({"p": report(a=[NOW - 10, NOW - 4])}, NOW)
    assert view.extra([pod(0, address=A, updated_at=NOW - 20)], DEPTH, NOW, horizon=5.0) == {A: 1}


def test_a_report_that_stops_changing_is_forgotten_and_its_own_is_ignored():
    view = PeerView("me", ttl=1.0)
    pods = [pod(0, address=A)]
    view.update({"p": report(1, a=[NOW + 0.5]), "me": report(1, a=[NOW + 0.5] * 9)}, NOW)
    assert view.extra(pods, DEPTH, NOW + 0.9, horizon=5.0) == {A: 1}
    view.update({"p": report(1, a=[NOW + 0.5])}, NOW + 0.9)  # the same sequence: no news
    assert view.extra(pods, DEPTH, NOW + 1.1, horizon=5.0) == {}
    assert view.stale(NOW + 1.1, after=1.0) == ["p"]
    view.update({"p": report(2, a=[NOW + 0.5])}, NOW + 1.1)  # it reports again
    assert view.extra(pods, DEPTH, NOW + 1.2, horizon=5.0) == {A: 1}
    view.update({}, NOW + 1.2)  # gone from the hash (or Redis unreachable): alone
    assert view.extra(pods, DEPTH, NOW + 1.2, horizon=5.0) == {}


@given(
    free=st.integers(0, 20),
    pickers=st.integers(1, 6),
    updated=st.floats(0, 1e6, allow_nan=False),
)
def test_the_shares_of_a_pod_s_room_add_up_to_the_room(free, pickers, updated):
    origins = [f"picker-{i}" for i in range(pickers)]
    thresholds = Thresholds(queue_depth=20, kv_cache=0.9)
    the_pod = pod(20 - free, address=A, updated_at=updated)
    mine = []
    for origin in origins:
        view = PeerView(origin)
        view.update({o: report(waiting=1) for o in origins}, updated)
        extra = view.extra([the_pod], thresholds, updated, horizon=5.0).get(A, 0)
        mine.append(room(the_pod, thresholds, extra))
    assert sum(mine) == free
    assert max(mine) - min(mine) <= 1


class Exchange:
    """Two flow controllers over one snapshot source, each reading the other's report at once (as if
    the Redis round trip took no time)."""

    def __init__(self, **flow: object) -> None:
        self.now = NOW + 1.0
        self.source = StaticSnapshotSource()
        cfg = config(flowControl={"enabled": True, "saturationDetector": {"queueDepthThreshold": 2}, **flow})
        self.views = {name: PeerView(name) for name in ("one", "two")}
        self.flows: dict[str, FlowController] = {}
        for name, view in self.views.items():
            director = Director(
                cfg, self.source, NoMetrics(), rng=random.Random(1), clock=self.clock, timer=time.perf_counter
            )
            self.flows[name] = FlowController(
                director, cfg, clock=self.clock, peers=lambda view=view: self._extra(view)
            )
        self.routed: list[tuple[str, str]] = []
        self.sequence = 0
        self.scrape(2, 2)

    def clock(self) -> float:
        return self.now

    def scrape(self, *waiting: int) -> None:
        pods = [pod(w, address=a, updated_at=self.now) for w, a in zip(waiting, (A, B), strict=True)]
        self.source.set(snapshot(*pods, published_at=self.now))
        self.now += 0.001

    def _extra(self, view: PeerView) -> dict[str, int]:
        self.sequence += 1
        reports = {
            name: Report(self.sequence, flow.waiting, {a: tuple(t) for a, t in flow.dispatches().items()})
            for name, flow in self.flows.items()
        }
        view.update(reports, self.now)
        current = self.source.current()
        assert current is not None
        return view.extra(current.pods, self.flows[view.origin].thresholds, self.now, horizon=5.0)

    def send(self, name: str, request_id: str, body: bytes = b'{"model":"my-model","prompt":"hi"}') -> None:
        result = self.flows[name].route(ctx(body, request_id=request_id))
        if isinstance(result, Waiting):
            result.answer = lambda answer, n=name: self._answer(n, answer)
        else:
            self._answer(name, result)

    def _answer(self, name: str, answer: object) -> None:
        assert isinstance(answer, Routing)
        self.routed.append((name, answer.endpoint))


@pytest.mark.parametrize("freed", [1, 2, 3])
def test_two_controllers_share_a_freed_slot_instead_of_both_taking_it(freed):
    pair = Exchange()
    for i in range(4):
        pair.send("one", f"one-{i}")
        pair.send("two", f"two-{i}")
    assert pair.routed == []  # saturated: every request waits
    pair.scrape(2 - freed, 2)  # room on A only
    for flow in pair.flows.values():
        flow.pump()
    assert len(pair.routed) == freed  # without the exchange, each controller would take all of it
    assert {endpoint for _, endpoint in pair.routed} == {A}
    if freed > 1:  # the room split between them
        assert {name for name, _ in pair.routed} == {"one", "two"}


def test_a_peer_s_share_under_a_pool_mean_does_not_hold_critical_requests():
    # Sheddable requests wait past a mean of 2 running + waiting per pod, Critical ones past 10; the
    # queue depth leaves each pod a room of about 1,000, half of it the peer's if that were shared.
    pair = Exchange(
        saturationDetector={"queueDepthThreshold": 1000, "maxPodRequests": 2},
        priorityBands=[{"priority": 0, "saturationDetector": {"maxPodRequests": 10}}],
    )
    pair.scrape(2, 2)
    for name in ("one", "two"):  # both pickers hold requests: the room is split between them
        pair.send(name, f"shed-{name}", b'{"model":"sql-lora-sheddable","prompt":"hi"}')
    assert pair.routed == []
    pair.send("one", "critical")
    assert [name for name, _ in pair.routed] == ["one"]
