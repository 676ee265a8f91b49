"""The flow controller: the director's steps with a wait between resolve and schedule.

A request is scheduled at once (by the profile, among all its candidates) while nothing of its band
or a higher one waits and the pool is not saturated; otherwise it waits in the
:class:`~.queue.FlowQueue` and its stream gets a :class:`Waiting` instead of a routing. The profile
keeps its own say: a request its terminal branch drops is dropped (429), now or at dispatch, as
without flow control. :meth:`pump` (called by the asyncio edge when a snapshot arrives, a request
ends, or a deadline comes) answers the expired, then dispatches from the head while the pool is not
saturated, each one scheduled afresh on the newest snapshot; one whose pod is expected to take
longer to start answering than its time limit has left (``flowControl.dispatchDeadline``, the waits
measured per pod by :mod:`.waits`) is answered there as expired instead of being sent to be late.
Every waiting request is answered exactly once: dispatched, dropped, refused, expired or evicted by
:meth:`drain`; or it is cancelled (its client went away) and never answered.

Pure: the clock comes in as an argument, the peers' counts through a callable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol

from pointsman_picker import errors
from pointsman_picker.context import RequestContext, Resolved
from pointsman_picker.director import Candidates, Director
from pointsman_picker.flowcontrol.queue import Bounds, Entry, FlowQueue, Full
from pointsman_picker.flowcontrol.saturation import Thresholds, room, saturated, saturation
from pointsman_picker.flowcontrol.waits import PodWaits
from pointsman_picker.routing import Routing
from pointsman_picker.scheduling.assignments import RecentAssignments
from pointsman_picker.scheduling.types import Drop, Pods
from pointsman_shared.config import FlowControlConfig, PointsmanConfig, PriorityBand

DEFAULT_FLOW = "default-flow"  # upstream's flow for a request without a fairness id
_MAX_FLOW_ID = 128
SCAN = 32  # waiting requests a dispatch round looks at past those whose pod has no room

Answer = Callable[["Routing | errors.PickerError"], None]


class FlowMetrics(Protocol):
    def waited(self, priority: int, flow: str, outcome: str, seconds: float) -> None:
        """A request left the queue after ``seconds``; ``outcome`` as upstream's label."""


class NoFlowMetrics:
    def waited(self, priority: int, flow: str, outcome: str, seconds: float) -> None:
        pass


# Upstream's outcome labels of inference_extension_flow_control_request_queue_duration_seconds.
DISPATCHED = "Dispatched"
REJECTED_CAPACITY = "RejectedCapacity"
EVICTED_TTL = "EvictedTTL"
EVICTED_CANCELLED = "EvictedContextCancelled"
EVICTED_OTHER = "EvictedOther"
REJECTED_OTHER = "RejectedOther"


class Late(NamedTuple):
    """The pod the profile picked is expected to start answering only past the request's deadline."""

    address: str
    expected: float  # its expected wait, seconds
    left: float  # what the request's time limit had left, seconds


class Waiting:
    """A request held in the queue. Its stream sets :attr:`answer` (called once, later: never from
    within :meth:`FlowController.route`) and calls :meth:`cancel` when its client goes away."""

    __slots__ = ("_controller", "answer", "entry", "reason", "resolved", "ttl")

    def __init__(self, controller: FlowController, resolved: Resolved, ttl: float, reason: str) -> None:
        self._controller = controller
        self.resolved = resolved
        self.ttl = ttl  # its band's time limit
        self.reason = reason  # why it had to wait, for the explain header
        self.entry: Entry[Waiting] | None = None
        self.answer: Answer | None = None

    def cancel(self) -> None:
        self._controller.cancel(self)


class FlowController:
    def __init__(
        self,
        director: Director,
        config: PointsmanConfig,
        *,
        clock: Callable[[], float],
        metrics: FlowMetrics | None = None,
        peers: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        """``clock`` is the director's (wall time); ``peers`` gives, per pod address, what the other
        pickers take of it beyond its snapshot (counted as waiting, like this picker's own recent
        assignments): :meth:`.peers.PeerView.extra`."""
        self._director = director
        self._clock = clock
        self._metrics = metrics or NoFlowMetrics()
        self._peers = peers
        # This picker's own assignments a scrape has not shown yet, whatever the profile counts.
        self._recent = RecentAssignments(config.picker.max_staleness)
        # Each pod's wait from dispatch to response headers, measured (responded()).
        self._waits = PodWaits(config.flow_control.dispatch_deadline.default_wait)
        # Per routed request until its response (by ticket key): whether its pod ran its target then.
        self._slotted: dict[int, bool] = {}
        self._queue: FlowQueue[Waiting] = FlowQueue(Bounds(1, 1), {}, Bounds(1, 1))
        self._closed = False  # drained: from then on, requests are placed at once (the picker stops)
        self.reconfigure(config)

    def reconfigure(self, config: PointsmanConfig) -> None:
        """New bounds and thresholds from the next request on (those waiting keep their deadline)."""
        flow = config.flow_control
        self._config: FlowControlConfig = flow
        self._thresholds = Thresholds.of(flow, config.scheduling)
        self._band_thresholds = {
            b.priority: Thresholds.of(flow, config.scheduling, b.priority) for b in flow.priority_bands
        }
        self._fairness_header = flow.fairness_header.lower()
        self._deadline_aware = flow.dispatch_deadline.enabled
        self._waits.default = flow.dispatch_deadline.default_wait  # the measured waits stay
        bands = {b.priority: Bounds(b.max_requests, b.max_bytes) for b in flow.priority_bands}
        default = PriorityBand(priority=0)  # the bounds of a priority no band names
        old = self._queue
        self._queue = FlowQueue(
            Bounds(flow.max_requests, flow.max_bytes), bands, Bounds(default.max_requests, default.max_bytes)
        )
        for entry in old.drain():  # keep the waiting ones, in order, with their deadlines
            moved = self._queue.push(
                entry.item,
                priority=entry.priority,
                flow=entry.flow,
                size=entry.size,
                now=entry.enqueued,
                ttl=entry.deadline - entry.enqueued,
                force=True,
            )
            entry.item.entry = moved

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def queue(self) -> FlowQueue[Waiting]:
        return self._queue

    @property
    def thresholds(self) -> Thresholds:
        return self._thresholds

    @property
    def waits(self) -> PodWaits:
        return self._waits

    def dispatches(self) -> dict[str, list[float]]:
        """This picker's assignments a scrape may not have shown yet, their times per pod address:
        what it reports to its peers (:mod:`.peers`)."""
        return self._recent.unseen()

    def route(self, context: RequestContext) -> Routing | Waiting:
        """Place the request now, or hold it: a :class:`Waiting`, or a
        :class:`~pointsman_picker.errors.PickerError` raised (bad request, queue full, ...)."""
        director = self._director
        resolved = director.resolve(context)
        candidates = director.candidates(resolved)
        if self._closed or candidates.fallback is not None:
            return self._placed(director.place(resolved, candidates), candidates)
        if self._queue.ahead(resolved.priority):
            reason = f"{len(self._queue)} waiting before it"
        elif self._saturated(candidates, resolved.priority):
            reason = "pool saturated"
        else:
            placed = self._place(resolved, candidates)  # NoCapacity: dropped, as without
            if isinstance(placed, Routing):
                return placed
            assert isinstance(placed, str)  # no deadline given: never Late
            reason = f"its pod {placed} has no room"
        now = candidates.now
        flow = (context.headers.get(self._fairness_header) or DEFAULT_FLOW)[:_MAX_FLOW_ID]
        priority = resolved.priority
        ttl = self._config.ttl(priority)
        waiting = Waiting(self, resolved, ttl, reason)
        size = len(context.body) if context.body is not None else 0
        try:
            waiting.entry = self._queue.push(
                waiting, priority=priority, flow=flow, size=size, now=now, ttl=ttl
            )
        except Full as full:
            self._metrics.waited(priority, flow, REJECTED_CAPACITY, 0.0)
            raise errors.QueueFull(
                f"flow control: {full}", model=resolved.model, target=resolved.target
            ) from None
        return waiting

    def pump(self) -> int:
        """Answer what expired, then dispatch while the pool has room; how many were answered. A
        request whose pick has no room keeps its place, and those behind it (up to ``SCAN`` of its
        band) may go first, as vLLM skips a request whose adapter has no slot: one full pod does not
        hold the queue while the others idle."""
        queue = self._queue
        if not queue:
            return 0
        now = self._clock()
        answered = 0
        for overdue in queue.expired(now):
            answered += 1
            self._expire(overdue, now)
        director = self._director
        blocked: set[str | None] = set()  # targets whose pick had no room: the same pod, this round
        moved = True
        while moved:
            moved = False
            for entry in queue.scan(SCAN):
                resolved = entry.item.resolved
                if resolved.target in blocked:
                    continue
                try:
                    candidates = director.candidates(resolved)
                except errors.PickerError as exc:
                    queue.take(entry)
                    answered += 1
                    self._answer(entry, exc, REJECTED_OTHER, now)
                    moved = True
                    break
                if candidates.fallback is None and self._saturated(candidates, entry.priority):
                    return answered
                deadline = entry.deadline if self._deadline_aware else None
                try:
                    placed: Routing | str | Late | errors.PickerError = self._place(
                        resolved, candidates, deadline
                    )
                except errors.PickerError as exc:  # NoCapacity among them: the profile drops it now
                    placed = exc
                if isinstance(placed, str):
                    blocked.add(resolved.target)
                    continue
                queue.take(entry)
                answered += 1
                if isinstance(placed, Late):
                    self._expire(entry, now, late=placed)
                    moved = True
                    break
                outcome = DISPATCHED if isinstance(placed, Routing) else REJECTED_OTHER
                self._answer(entry, placed, outcome, now)
                moved = True
                break  # again from the new order: the flow served went behind the others
        return answered

    def next_deadline(self) -> float | None:
        return self._queue.next_deadline()

    def cancel(self, waiting: Waiting) -> None:
        """``waiting``'s client went away: it leaves the queue, unanswered."""
        entry = waiting.entry
        if entry is not None and self._queue.remove(entry):
            self._metrics.waited(
                entry.priority, entry.flow, EVICTED_CANCELLED, self._clock() - entry.enqueued
            )

    def drain(self) -> int:
        """The picker stops: answer every waiting request (503); how many there were."""
        self._closed = True
        now = self._clock()
        entries = self._queue.drain()
        for entry in entries:
            resolved = entry.item.resolved
            error = errors.Evicted(
                "the picker stopped while the request waited", model=resolved.model, target=resolved.target
            )
            self._answer(entry, error, EVICTED_OTHER, now)
        return len(entries)

    def finished(self, routing: Routing) -> None:
        """A routed request ended: it waits nowhere any more."""
        if routing.ticket is not None:
            self._recent.finished(routing.ticket)
            self._slotted.pop(routing.ticket.key, None)

    def responded(self, routing: Routing) -> None:
        """A routed request's response headers came: its pod's wait, from the decision to now, is
        measured (placed at once or dispatched from the queue alike: the pod's state is what counts)."""
        ticket = routing.ticket
        if ticket is not None and (slotted := self._slotted.pop(ticket.key, None)) is not None:
            self._waits.observe(ticket.address, self._clock() - ticket.at, routing.target, slotted)

    def saturation(self) -> float:
        """The pool's saturation as the detector sees it now (0 without a usable snapshot)."""
        snapshot = self._director.fresh_snapshot(self._clock())
        if snapshot is None:
            return 0.0
        pods = self._loaded(self._director.usable(snapshot, self._clock()))
        return saturation(pods, self._thresholds, self._peer_counts())

    def _place(
        self, resolved: Resolved, candidates: Candidates, deadline: float | None = None
    ) -> Routing | str | Late:
        """The profile's pick committed, or, when the pod it picks has no room for the band (its queue
        or KV cache at the detector's thresholds, assignments counted), that pod's address: the
        request waits here instead. The detector says only that some pod has room; the profile may
        pick another by affinity, and in that pod's queue a request could not move (Critical requests
        waited seconds there for an adapter slot while other pods idled). With a ``deadline`` (a held
        request's), a pick whose pod is expected to start answering past it is not committed:
        :class:`Late`."""
        director = self._director
        if candidates.fallback is not None:
            return self._placed(director.place(resolved, candidates), candidates)
        decision = director.schedule(resolved, candidates)
        picked = decision.outcome
        if not isinstance(picked, Drop):
            address = picked.address
            pod = self._loaded(candidates)[candidates.positions[address]]
            thresholds = self._band_thresholds.get(resolved.priority, self._thresholds)
            if not room(pod, thresholds, self._peer_counts().get(address, 0)):
                return address
            if deadline is not None:
                target = resolved.target or ""
                slotted = self._runs_target(candidates, address, target)
                expected = self._waits.expected(address, target, slotted)
                if candidates.now + expected > deadline:
                    return Late(address, expected, deadline - candidates.now)
        return self._placed(director.commit(resolved, candidates, decision), candidates)

    def _placed(self, routing: Routing, candidates: Candidates) -> Routing:
        ticket = routing.ticket
        if ticket is not None:
            self._recent.record(ticket)
            self._slotted[ticket.key] = self._runs_target(candidates, ticket.address, routing.target)
        return routing

    @staticmethod
    def _runs_target(candidates: Candidates, address: str, target: str) -> bool:
        """Whether the pod at ``address`` runs ``target`` (an adapter in a slot) as the snapshot shows:
        its waits differ from a target that needs a slot first (:mod:`.waits`)."""
        position = candidates.positions.get(address)
        return position is not None and target in candidates.pods[position].running_adapters

    def _loaded(self, candidates: Candidates) -> Pods:
        return self._recent.adjust(
            candidates.pods, candidates.positions, not_before=candidates.now - self._recent.horizon
        )

    def _peer_counts(self) -> Mapping[str, int]:
        return self._peers() if self._peers is not None else {}

    def _saturated(self, candidates: Candidates, priority: int) -> bool:
        """Whether the pool is saturated for a request of ``priority`` (its band's thresholds)."""
        thresholds = self._band_thresholds.get(priority, self._thresholds)
        return saturated(self._loaded(candidates), thresholds, self._peer_counts())

    def _expire(self, entry: Entry[Waiting], now: float, late: Late | None = None) -> None:
        """Its band's expiry answer: it waited its limit, or (``late``) its pod would answer past it."""
        resolved = entry.item.resolved
        waited = now - entry.enqueued
        if late is None:
            message = f"flow control: waited {waited:.3f}s, the limit of its band (priority {entry.priority})"
            explain = ""
        else:
            message = (
                f"flow control: waited {waited:.3f}s; its pod would answer past the limit of its band"
                f" (priority {entry.priority})"
            )
            explain = (
                f"not dispatched: its pod {late.address} is expected to start answering in"
                f" {late.expected:.3f}s, {late.left:.3f}s of its limit left"
            )
        error: errors.PickerError
        if resolved.request.critical:
            error = errors.QueueExpired(
                message, model=resolved.model, target=resolved.target, explain=explain
            )
        else:
            error = errors.ShedExpired(message, model=resolved.model, target=resolved.target, explain=explain)
        self._answer(entry, error, EVICTED_TTL, now)

    def _answer(
        self, entry: Entry[Waiting], result: Routing | errors.PickerError, outcome: str, now: float
    ) -> None:
        waited = max(now - entry.enqueued, 0.0)
        self._metrics.waited(entry.priority, entry.flow, outcome, waited)
        waiting = entry.item
        if waiting.resolved.context.explain:
            why = (
                f"waited {waited:.3f}s in flow control (priority {entry.priority}, flow {entry.flow}):"
                f" {waiting.reason}"
            )
            if isinstance(result, Routing):
                result = result._replace(explain=f"{why}; {result.explain}" if result.explain else why)
            else:
                result.explain = f"{why}; {result.explain}" if result.explain else why
        if waiting.answer is not None:
            waiting.answer(result)
