"""The picker's own decision path in virtual time: the :class:`~pointsman_picker.director.Director` that
the ext_proc server calls per request (model resolution, staleness, recent assignments released when
the request ends, the configured profile), with the simulator's clock and a seeded ``random.Random``.

The fleet driver refreshes every pod's snapshot each 50 ms, as the collector publishes them; this
router wraps each refresh in a :class:`~pointsman_shared.snapshot.PoolSnapshot` for an in-memory
snapshot source. No Redis, no gRPC.

A request's prompt text is what its token spans say (:func:`prompt_text`): requests that share a span
share its text, so the picker's prefix index sees the prefixes the simulated pods cache. A request
without spans shares nothing, so its text starts with its own number.

:class:`TwoPickers` is two Directors behind one Envoy: each request goes to one of them at random. With
``shared``, what one picker's prefix index records reaches the other's ``delay`` seconds later (an
in-process stand-in for the Redis stream of :mod:`pointsman_picker.prefix_sync`, whose sync runs every
50 ms: the default delay is that interval plus a round trip); without, each has its own index only.

With flow control on and ``share_dispatches``, the two flow controllers count each other's dispatches
as the live pickers do through Redis (:mod:`pointsman_picker.peer_sync`): every ``report_interval``
(20 ms) each picker's report (its assignments not scraped yet, its queue length) reaches the other's
:class:`~pointsman_picker.flowcontrol.peers.PeerView` ``report_delay`` later (a round trip).

With ``flowControl.enabled`` the router goes through the picker's
:class:`~pointsman_picker.flowcontrol.controller.FlowController`: a request it holds is the fleet
driver's :data:`~pointsman_sim.fleet.HOLD`, and :meth:`DirectorRouter.dispatch` pumps the controller
(as the picker's flow gate does on a snapshot, a finished request, or its timer) and hands over what
it answered.
"""

from __future__ import annotations

import json
import random
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from pointsman_picker.context import RequestContext
from pointsman_picker.director import Director
from pointsman_picker.errors import PickerError
from pointsman_picker.flowcontrol.controller import FlowController, Waiting
from pointsman_picker.flowcontrol.peers import PeerView, Report
from pointsman_picker.interfaces import NoMetrics
from pointsman_picker.routing import Routing
from pointsman_picker.scheduling.prefix_cache import Announcement, PrefixCacheProducer
from pointsman_shared.config import PointsmanConfig
from pointsman_shared.snapshot import PodSnapshot, PoolSnapshot
from pointsman_sim.fleet import HOLD, Hold, Placement, TraceRequest
from pointsman_sim.prefix import prompt_text as spans_text


class FleetSnapshots:
    """The newest pool snapshot, replaced when the fleet driver hands over a new round of pods."""

    def __init__(self, pool: str) -> None:
        self._pool = pool
        self._pods: Sequence[PodSnapshot] | None = None
        self._snapshot: PoolSnapshot | None = None

    def update(self, pods: Sequence[PodSnapshot]) -> bool:
        """Take a round of pods; ``True`` when it is a new one."""
        if pods is self._pods:
            return False
        version = self._snapshot.version + 1 if self._snapshot else 1
        published = max((pod.updated_at for pod in pods), default=0.0)
        self._pods = pods
        self._snapshot = PoolSnapshot(self._pool, version, published, tuple(pods))
        return True

    def current(self) -> PoolSnapshot | None:
        return self._snapshot


class DirectorRouter:
    """A fleet-driver router that asks the picker's Director for every request; ``None`` (shed) when it
    answers with an error (a 429, or a 503 when no pod is fresh)."""

    def __init__(
        self,
        config: PointsmanConfig,
        base_model: str,
        rng: random.Random,
        *,
        peers: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        """``peers``: the flow controller's (the other pickers' part of each pod)."""
        self.now = 0.0
        self._base = base_model
        self._snapshots = FleetSnapshots(config.pool.name)
        self.director = Director(
            config,
            self._snapshots,
            NoMetrics(),
            rng=rng,
            clock=lambda: self.now,
            timer=time.perf_counter,
        )
        self._index: dict[str, int] = {}
        self._routings: dict[int, Routing] = {}  # by id() of the trace request, while it runs
        self._count = 0
        self.errors: dict[int, int] = {}  # HTTP status -> count
        self.flow: FlowController | None = None
        if config.flow_control.enabled:
            self.flow = FlowController(self.director, config, clock=lambda: self.now, peers=peers)
        self._answered: list[tuple[TraceRequest, Routing | PickerError]] = []

    def __call__(self, request: TraceRequest, pods: Sequence[PodSnapshot]) -> Placement | Hold | None:
        self.now = request.arrival
        self._see(pods)
        headers = {"x-gateway-inference-fairness-id": request.tenant} if request.tenant else {}
        context = RequestContext(str(id(request)), self._body(request), headers, request.objective)
        try:
            if self.flow is None:
                return self._choice(request, self.director.route(context))
            result = self.flow.route(context)
        except PickerError as exc:
            return self._choice(request, exc)
        if isinstance(result, Waiting):
            result.answer = lambda answer: self._answered.append((request, answer))
            return HOLD
        return self._choice(request, result)

    def dispatch(
        self, now: float, pods: Sequence[PodSnapshot]
    ) -> list[tuple[TraceRequest, Placement | None]]:
        """The held requests the flow controller answers at ``now``, each with its pod (``None``:
        refused or expired)."""
        if self.flow is None:
            return []
        self.now = now
        self._see(pods)
        self.flow.pump()
        answered, self._answered = self._answered, []
        return [(request, self._choice(request, answer)) for request, answer in answered]

    def finished(self, request: TraceRequest) -> None:
        """``request`` has ended: its ext_proc stream closes, as live."""
        routing = self._routings.pop(id(request), None)
        if routing is not None:
            self.director.release(routing)
            if self.flow is not None:
                self.flow.finished(routing)

    def first_token(self, request: TraceRequest, at: float) -> None:
        """``request``'s first token came at ``at``: a live picker sees its response headers then, and
        flow control measures its pod's wait."""
        routing = self._routings.get(id(request))
        if routing is not None and self.flow is not None:
            self.now = at
            self.flow.responded(routing)

    def snapshot(self) -> PoolSnapshot | None:
        return self._snapshots.current()

    def _see(self, pods: Sequence[PodSnapshot]) -> None:
        if self._snapshots.update(pods):
            self._index = {pod.address: i for i, pod in enumerate(pods)}

    def _choice(self, request: TraceRequest, answer: Routing | PickerError) -> Placement | None:
        if isinstance(answer, PickerError):
            self.errors[answer.status] = self.errors.get(answer.status, 0) + 1
            return None
        self._routings[id(request)] = answer
        target = answer.target or request.adapter
        return Placement(self._index[answer.endpoint], None if target == self._base else target)

    def _body(self, request: TraceRequest) -> bytes:
        model = request.adapter or self._base
        self._count += 1
        return request_body(model, prompt_text(request, self._count))

    def producers(self) -> list[PrefixCacheProducer]:
        """The prefix indexes of the running profile (none when it weighs no prefix)."""
        return [p for p in self.director.request_plugins() if isinstance(p, PrefixCacheProducer)]


def prompt_text(request: TraceRequest, number: int) -> str:
    """Four characters a token, as the simulator counts them: the text of the request's spans (the
    simulator's stand-in tokenizer reads it back as the spans' ids), or, without spans, the request's
    ``number`` then filler, so that requests without spans share no prefix."""
    if request.tokens:
        return spans_text(request.tokens, request.prompt_tokens)
    length = 4 * request.prompt_tokens
    return (f"request {number}: " + "x" * length)[:length]


def request_body(model: str, prompt: str) -> bytes:
    """The body a client would send (so a picker that weighs prompts sees the sizes the pods will see)."""
    return json.dumps({"model": model, "prompt": prompt, "max_tokens": 1}).encode()


class TwoPickers:
    """Two picker replicas behind one Envoy (module docstring)."""

    def __init__(
        self,
        config: PointsmanConfig,
        base_model: str,
        rng: random.Random,
        *,
        shared: bool,
        delay: float = 0.06,
        share_dispatches: bool = False,
        report_interval: float = 0.02,
        report_delay: float = 0.001,
    ) -> None:
        self._rng = rng
        self._horizon = config.picker.max_staleness
        self.views = (PeerView("picker-0"), PeerView("picker-1"))
        self.pickers = tuple(
            DirectorRouter(
                config,
                base_model,
                random.Random(rng.random()),
                peers=self._peers_of(i) if share_dispatches else None,
            )
            for i in range(2)
        )
        self._shared = shared
        self._delay = delay
        self._share_dispatches = share_dispatches
        self._report_interval = report_interval
        self._report_delay = report_delay
        self._next_report = 0.0
        self._sequence = 0
        # Per picker, the other's reports on their way: (due, report), oldest first.
        self._reports: tuple[deque[tuple[float, Report]], ...] = (deque(), deque())
        self._by_request: dict[int, DirectorRouter] = {}
        # Per picker, what the other one announced: (due, announcements), oldest first.
        self._inbound: tuple[deque[tuple[float, list[Announcement]]], ...] = (deque(), deque())

    @property
    def errors(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for picker in self.pickers:
            for status, count in picker.errors.items():
                out[status] = out.get(status, 0) + count
        return out

    def __call__(self, request: TraceRequest, pods: Sequence[PodSnapshot]) -> Placement | Hold | None:
        now = request.arrival
        if self._shared:
            self._deliver(now)
        if self._share_dispatches:
            self._exchange(now)
        i = self._rng.randrange(2)
        picker = self.pickers[i]
        placement = picker(request, pods)
        self._by_request[id(request)] = picker
        if self._shared:
            for producer in picker.producers():
                sent = producer.drain(producer.outbox())
                if sent:
                    self._inbound[1 - i].append((now + self._delay, sent))
        return placement

    def dispatch(
        self, now: float, pods: Sequence[PodSnapshot]
    ) -> list[tuple[TraceRequest, Placement | None]]:
        """What each picker's flow controller answers at ``now`` (each holds its own requests)."""
        if self._share_dispatches:
            self._exchange(now)
        return [answer for picker in self.pickers for answer in picker.dispatch(now, pods)]

    def _exchange(self, now: float) -> None:
        """The reports due by ``now`` delivered, and each picker's next report sent when its time has come."""
        for i, (view, reports) in enumerate(zip(self.views, self._reports, strict=True)):
            if reports and reports[0][0] <= now:
                while len(reports) > 1 and reports[1][0] <= now:
                    reports.popleft()  # only the newest matters
                _, report = reports.popleft()
                view.update({self.views[1 - i].origin: report}, now)
        if now >= self._next_report:
            self._next_report = now + self._report_interval
            self._sequence += 1
            for i, picker in enumerate(self.pickers):
                flow = picker.flow
                if flow is None:
                    continue
                report = Report(
                    self._sequence, flow.waiting, {a: tuple(t) for a, t in flow.dispatches().items()}
                )
                self._reports[1 - i].append((now + self._report_delay, report))

    def _peers_of(self, i: int) -> Callable[[], Mapping[str, int]]:
        return lambda: self._peer_extra(i)

    def _peer_extra(self, i: int) -> Mapping[str, int]:
        picker = self.pickers[i]
        snapshot = picker.snapshot()
        if snapshot is None or picker.flow is None:
            return {}
        return self.views[i].extra(snapshot.pods, picker.flow.thresholds, picker.now, horizon=self._horizon)

    def _deliver(self, now: float) -> None:
        for picker, inbound in zip(self.pickers, self._inbound, strict=True):
            while inbound and inbound[0][0] <= now:
                _, announcements = inbound.popleft()
                for producer in picker.producers():
                    producer.learn(announcements)

    def finished(self, request: TraceRequest) -> None:
        picker = self._by_request.pop(id(request), None)
        if picker is not None:
            picker.finished(request)

    def first_token(self, request: TraceRequest, at: float) -> None:
        picker = self._by_request.get(id(request))
        if picker is not None:
            picker.first_token(request, at)
