"""From a request to a destination, in four steps: resolve the model, find the candidate pods, schedule
(the profile's request plugins prepare, then its filters, scorers and picker run), commit the pick.

Pure: no gRPC, protobuf, Redis, Prometheus or asyncio here or in what it imports (an import-linter
contract holds it), and the clock, the timer and the randomness come in as arguments. The ext_proc
stream calls :meth:`Director.route` once per request with its
:class:`~pointsman_picker.context.RequestContext` and turns the result (or the
:class:`~pointsman_picker.errors.PickerError` it raises) into Envoy responses; the quality benchmark
calls it in virtual time. A layer that holds requests (flow control) calls the steps itself, with its
wait between :meth:`Director.resolve` and :meth:`Director.candidates`.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
from collections.abc import Callable, Mapping
from typing import NamedTuple

from pointsman_picker import errors
from pointsman_picker.body import parse_body, with_model
from pointsman_picker.context import RequestContext, Resolved
from pointsman_picker.explain import DecisionTrace
from pointsman_picker.interfaces import RoutingMetrics, SnapshotSource
from pointsman_picker.resolution import ModelCatalog
from pointsman_picker.routing import Routing
from pointsman_picker.scheduling import CycleState, Drop, Pods, SchedulingRequest, Ticket
from pointsman_picker.scheduling.assignments import POSITIONS
from pointsman_picker.scheduling.indexed import indexed
from pointsman_picker.scheduling.profiles import Profile, build_profile
from pointsman_shared.config import FailureMode, PointsmanConfig
from pointsman_shared.snapshot import PodSnapshot, PoolSnapshot, is_fresh

# Timing every plugin of every decision would cost more than the plugins; one decision in this many is
# timed for inference_extension_plugin_duration_seconds.
PLUGIN_TIMING_EVERY = 16

# Models passed through as asked are client input: the first this many get a metric label of their own.
PASSTHROUGH_LABELS = 256

log = logging.getLogger(__name__)


class BoundedLabels:
    """Label values from client input, bounded: the first ``limit`` distinct values are their own
    label (cut to 128 characters), any later one is ``other``."""

    OTHER = "other"

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._seen: set[str] = set()

    def label(self, value: str) -> str:
        value = value[:128]
        if value in self._seen:
            return value
        if len(self._seen) >= self._limit:
            return self.OTHER
        self._seen.add(value)
        return value


def usable_pods(snapshot: PoolSnapshot, now: float, max_age: float) -> tuple[Pods, bool]:
    """The fresh healthy pods; all pods (and ``True``, "stale") when there is none."""
    fresh = tuple(pod for pod in snapshot.pods if pod.healthy and is_fresh(pod, now, max_age))
    return (fresh, False) if fresh else (snapshot.pods, True)


class Candidates(NamedTuple):
    """The pods a request may go to at ``now``: ``pods`` (indexed for the filters) with each one's
    position by address; ``stale`` when no pod was fresh and all are used. With no pod at all,
    ``fallback`` is the endpoint FailOpen sends the request to."""

    pods: Pods
    positions: Mapping[str, int]
    stale: bool
    now: float
    fallback: str | None = None


class UsablePods:
    """:func:`usable_pods` of the current snapshot, kept until the snapshot changes or the first of its
    fresh pods ages past ``max_age`` (a 512-pod pool costs a pass per request otherwise), indexed for
    the filters, with each pod's position by address."""

    def __init__(self, max_age: float) -> None:
        self._max_age = max_age
        self._snapshot: PoolSnapshot | None = None
        self._until = 0.0
        self._pods: Pods = ()
        self._stale = True
        self._positions: dict[str, int] = {}

    def get(self, snapshot: PoolSnapshot, now: float) -> Candidates:
        if snapshot is not self._snapshot or now > self._until:
            pods, stale = usable_pods(snapshot, now, self._max_age)
            self._snapshot, self._pods, self._stale = snapshot, indexed(pods), stale
            # Stale pods turn fresh only with a new snapshot; fresh ones turn stale one by one.
            self._until = math.inf if stale else min(p.updated_at for p in pods) + self._max_age
            self._positions = {pod.address: i for i, pod in enumerate(pods)}
        return Candidates(self._pods, self._positions, self._stale, now)


class Decision(NamedTuple):
    """What scheduling made of a request: its pod or why it was dropped, the request's cycle state
    (the plugins' data, which the hooks after the pick read), and the path taken when asked for."""

    outcome: PodSnapshot | Drop
    state: CycleState
    explain: str = ""
    pods: int = 0  # how many the profile chose among


class Director:
    def __init__(
        self,
        config: PointsmanConfig,
        source: SnapshotSource,
        metrics: RoutingMetrics,
        *,
        rng: random.Random,
        clock: Callable[[], float],
        timer: Callable[[], float],
    ) -> None:
        """``clock`` is wall time in seconds (snapshots carry it); ``timer`` a monotonic clock for the
        scheduler's own duration (``time.perf_counter`` in the server)."""
        self._source = source
        self._metrics = metrics
        self._rng = rng
        self._clock = clock
        self._timer = timer
        self._last_seen: PoolSnapshot | None = None
        self._last_known: tuple[str, ...] = ()  # see _remember
        self._decisions = 0
        self._tickets = itertools.count(1)
        self._passthrough_labels = BoundedLabels(PASSTHROUGH_LABELS)
        self._profile: Profile | None = None
        self.reconfigure(config)

    def reconfigure(self, config: PointsmanConfig) -> None:
        """Use ``config``'s models, profile, freshness and failure mode from the next request on. The
        request plugins whose spec did not change are kept, state and all (assignments in flight keep
        counting)."""
        self._catalog = ModelCatalog(
            config.models, config.objectives, passthrough=config.picker.passthrough_unknown_models
        )
        reuse = self._profile.lifecycle.by_spec() if self._profile is not None else None
        self._profile = build_profile(config, reuse)
        self._lifecycle = lifecycle = self._profile.lifecycle
        # The hooks, looped over here: a call per request saved for each.
        self._prepare, self._picked, self._finished = lifecycle.hooks()
        self.profile = self._profile.name  # the label of decisions
        self._max_staleness = config.picker.max_staleness
        self._usable = UsablePods(self._max_staleness)
        self._failing_open = config.pool.failure_mode is FailureMode.FAIL_OPEN
        self._endpoints = config.pool.endpoints

    def route(self, context: RequestContext) -> Routing:
        """Route a request through the four steps. With ``context.explain`` (or DEBUG logging) the
        routing carries the path taken; a :class:`~pointsman_picker.errors.PickerError` raised after
        scheduling carries it too."""
        resolved = self.resolve(context)
        candidates = self.candidates(resolved)
        if candidates.fallback is not None:
            return self._fail_open(resolved, candidates)
        return self.commit(resolved, candidates, self.schedule(resolved, candidates))

    def resolve(self, context: RequestContext) -> Resolved:
        """The request's model resolved (a weighted draw among its targets, its objective's priority)
        and its body rewritten for the target; :class:`~pointsman_picker.errors.BadRequest` or
        :class:`~pointsman_picker.errors.UnknownModel` when that cannot be."""
        body = context.body
        if body is None:
            request = SchedulingRequest(target_model=None, critical=False, request_id=context.request_id)
            return Resolved(context, request, None, False, "", "", 0, None)
        parsed = parse_body(body)
        resolution = self._catalog.resolve(parsed.model, self._rng, context.objective)
        if resolution is None:
            # No model label: the name is client input, and metric labels must stay bounded.
            raise errors.UnknownModel(f"no InferenceModel for model {parsed.model[:200]!r}")
        forward = with_model(parsed, resolution.target)
        request = SchedulingRequest(
            target_model=resolution.target,
            critical=resolution.critical,
            body=parsed.doc,
            request_id=context.request_id,
        )
        model = target = resolution.model
        if resolution.configured:
            target = resolution.target
        else:
            model = target = self._passthrough_labels.label(model)
        return Resolved(
            context, request, forward, forward is not body, model, target, resolution.priority, resolution
        )

    def fresh_snapshot(self, now: float) -> PoolSnapshot | None:
        """The newest snapshot, if the collector published it at most ``picker.maxStaleness`` ago (the
        rule for routing and for readiness alike)."""
        snapshot = self._source.current()
        if snapshot is not self._last_seen and snapshot is not None:
            self._remember(snapshot)
        if snapshot is not None and now - snapshot.published_at > self._max_staleness:
            return None  # the collector (or Redis) has gone quiet: the failure mode decides
        return snapshot

    def candidates(self, resolved: Resolved) -> Candidates:
        """The usable pods now (fresh and healthy; all of them, stale, when none is); the FailOpen
        fallback when there is none; else :class:`~pointsman_picker.errors.NoEndpoints`."""
        now = self._clock()
        snapshot = self.fresh_snapshot(now)
        if snapshot is not None and snapshot.pods:
            return self._usable.get(snapshot, now)
        fallback = self._endpoints or self._last_known
        if self._failing_open and fallback:
            return Candidates((), {}, True, now, fallback[self._rng.randrange(len(fallback))])
        why = "no fresh pool snapshot" if snapshot is None else "the pool has no pods"
        raise errors.NoEndpoints(why, model=resolved.model, target=resolved.target)

    def schedule(self, resolved: Resolved, candidates: Candidates) -> Decision:
        """The profile's request plugins prepare (their data into the request's cycle state, their
        numbers into the pods), then its filters, scorers and picker choose a pod or drop the request."""
        explain = resolved.context.explain or log.isEnabledFor(logging.DEBUG)
        self._decisions += 1
        timed = self._decisions % PLUGIN_TIMING_EVERY == 0
        trace = DecisionTrace(self._timer) if explain or timed else None
        start = self._timer()
        request, now = resolved.request, candidates.now
        state = CycleState()
        state[POSITIONS] = candidates.positions
        pods = candidates.pods
        for prepare in self._prepare:
            pods = prepare(request, pods, state, now)
        assert self._profile is not None
        outcome = self._profile.schedule(request, pods, state, self._rng, trace)
        self._metrics.scheduled(self._timer() - start)
        path = ""
        if trace is not None:
            if timed:
                self._metrics.plugins_timed(trace.steps)
            if explain:
                done = (
                    f"dropped ({outcome.reason})"
                    if isinstance(outcome, Drop)
                    else f"picked {outcome.address}"
                )
                notes = self._lifecycle.notes(state)
                path = trace.describe(pods=len(pods), notes=notes, stale=candidates.stale, outcome=done)
        return Decision(outcome, state, path, len(pods))

    def commit(self, resolved: Resolved, candidates: Candidates, decision: Decision) -> Routing:
        """The request takes its pod: the plugins hear of it and the decision is counted; a dropped
        request is :class:`~pointsman_picker.errors.NoCapacity`."""
        outcome = decision.outcome
        if isinstance(outcome, Drop):
            raise errors.NoCapacity(
                outcome.reason, model=resolved.model, target=resolved.target, explain=decision.explain
            )
        ticket = Ticket(next(self._tickets), outcome.address, candidates.now)
        request, state = resolved.request, decision.state
        for picked in self._picked:
            picked(ticket, request, state)
        result = "picked_stale" if candidates.stale else "picked"
        return self._routed(resolved, outcome.address, ticket, result, decision.explain, decision.pods)

    def release(self, routing: Routing) -> None:
        """The request ``routing`` sent is over (its stream closed)."""
        if routing.ticket is not None:
            for finished in self._finished:
                finished(routing.ticket)

    def _fail_open(self, resolved: Resolved, candidates: Candidates) -> Routing:
        assert candidates.fallback is not None
        path = f"no fresh pods; failureMode FailOpen; picked {candidates.fallback}"
        return self._routed(resolved, candidates.fallback, None, "fail_open", path, 0)

    def _routed(
        self, resolved: Resolved, endpoint: str, ticket: Ticket | None, result: str, path: str, pods: int
    ) -> Routing:
        self._metrics.routed(resolved.model, resolved.target, resolved.priority, self.profile, result)
        return Routing(
            endpoint,
            resolved.forward,
            resolved.rewritten,
            resolved.model,
            resolved.target,
            path,
            resolved.priority,
            resolved.context.request_id,
            ticket,
            result,
            pods,
        )

    def _remember(self, snapshot: PoolSnapshot) -> None:
        """Keep the pods of the newest snapshot that had any (its healthy ones, if it had such): where
        FailOpen sends requests when no fresh snapshot is left and the config lists no endpoints (a
        pool discovered in Kubernetes)."""
        self._last_seen = snapshot
        healthy = tuple(pod.address for pod in snapshot.pods if pod.healthy)
        if healthy or snapshot.pods:
            self._last_known = healthy or tuple(pod.address for pod in snapshot.pods)
