"""From a complete request to a destination: resolve the model, rewrite the body, pick a pod.

Pure: no gRPC, protobuf, Redis, Prometheus or asyncio here or in what it imports (an import-linter
contract holds it), and the clock, the timer and the randomness come in as arguments. The ext_proc
stream calls :meth:`Director.route` once per request and turns the result (or the
:class:`~pointsman_picker.errors.PickerError` it raises) into Envoy responses; the quality benchmark
calls it in virtual time.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from collections.abc import Callable

from pointsman_picker import errors
from pointsman_picker.assignments import PrefillBacklog, RecentAssignments, RecentTargets
from pointsman_picker.body import estimate_prompt_tokens, parse_body, with_model
from pointsman_picker.explain import DecisionTrace
from pointsman_picker.ports import RoutingMetrics, SnapshotSource
from pointsman_picker.resolution import ModelCatalog
from pointsman_picker.routing import Routing
from pointsman_picker.scheduling import Drop, Pods, Scheduler, SchedulingRequest
from pointsman_picker.scheduling.indexed import indexed
from pointsman_picker.scheduling.profiles import build_profile
from pointsman_shared.config import FailureMode, PointsmanConfig
from pointsman_shared.snapshot import PoolSnapshot, is_fresh

# Timing every filter of every decision would cost more than the filters; one decision in this many is
# timed for inference_extension_plugin_duration_seconds.
PLUGIN_TIMING_EVERY = 16
# Long enough to see the tail of a Zipf mix of adapters at tens of requests a second.
RECENT_TARGETS_WINDOW = 30.0

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
        self.index: dict[str, int] = {}

    def get(self, snapshot: PoolSnapshot, now: float) -> tuple[Pods, bool]:
        if snapshot is not self._snapshot or now > self._until:
            pods, stale = usable_pods(snapshot, now, self._max_age)
            self._snapshot, self._pods, self._stale = snapshot, indexed(pods), stale
            # Stale pods turn fresh only with a new snapshot; fresh ones turn stale one by one.
            self._until = math.inf if stale else min(p.updated_at for p in pods) + self._max_age
            self.index = {pod.address: i for i, pod in enumerate(pods)}
        return self._pods, self._stale


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
        self._assignments: RecentAssignments | None = None
        self._backlog: PrefillBacklog | None = None
        self._targets: RecentTargets | None = None
        self._backlog_rate = 0.0
        self._last_seen: PoolSnapshot | None = None
        self._last_known: tuple[str, ...] = ()  # see _remember
        self._decisions = 0
        self._passthrough_labels = BoundedLabels(PASSTHROUGH_LABELS)
        self.reconfigure(config)

    def reconfigure(self, config: PointsmanConfig) -> None:
        """Use ``config``'s models, thresholds, freshness and failure mode from the next request on.
        Assignments still in flight keep counting."""
        self._catalog = ModelCatalog(
            config.models, config.objectives, passthrough=config.picker.passthrough_unknown_models
        )
        self._scheduler = Scheduler(config.scheduling, self._rng, profile=build_profile(config))
        self.profile = self._scheduler.profile.name  # the label of decisions
        self._max_staleness = config.picker.max_staleness
        self._usable = UsablePods(self._max_staleness)
        self._fail_open = config.pool.failure_mode is FailureMode.FAIL_OPEN
        self._endpoints = config.pool.endpoints
        if not config.picker.count_assignments:
            self._assignments = None
        elif self._assignments is None:
            self._assignments = RecentAssignments()
        # The prompt tokens each pod has still to compute, for profiles whose filters weigh them.
        rate = config.picker.prefill_tokens_per_second
        if not self._scheduler.profile.uses_pending_prefill:
            self._backlog = None
        elif self._backlog is None or self._backlog_rate != rate:
            self._backlog = PrefillBacklog(rate)
        self._backlog_rate = rate
        if not self._scheduler.profile.uses_pending_prefill:
            self._targets = None
        elif self._targets is None:
            self._targets = RecentTargets(RECENT_TARGETS_WINDOW)

    def route(self, body: bytes | None, explain: bool = False, objective: str | None = None) -> Routing:
        """Route a request; ``body`` is ``None`` when the request has none (routed without a model);
        ``objective`` is the InferenceObjective the request names, if any. With ``explain`` (or DEBUG
        logging) the routing carries the path taken; a :class:`~pointsman_picker.errors.PickerError`
        raised after scheduling carries it too."""
        explain = explain or log.isEnabledFor(logging.DEBUG)
        if body is None:
            request = SchedulingRequest(target_model=None, critical=False)
            endpoint, result, now, path = self._pick(request, "", "", explain)
            self._metrics.routed("", "", 0, self.profile, result)
            return Routing(endpoint, None, rewritten=False, assigned_at=now, explain=path)
        parsed = parse_body(body)
        resolution = self._catalog.resolve(parsed.model, self._rng, objective)
        if resolution is None:
            # No model label: the name is client input, and metric labels must stay bounded.
            raise errors.UnknownModel(f"no InferenceModel for model {parsed.model[:200]!r}")
        final = with_model(parsed, resolution.target)
        request = SchedulingRequest(
            target_model=resolution.target,
            critical=resolution.critical,
            prompt_tokens=estimate_prompt_tokens(parsed.doc) if self._backlog is not None else 0,
        )
        model = target = resolution.model
        if resolution.configured:
            target = resolution.target
        else:
            model = target = self._passthrough_labels.label(model)
        endpoint, result, now, path = self._pick(request, model, target, explain)
        self._metrics.routed(model, target, resolution.priority, self.profile, result)
        return Routing(
            endpoint, final, final is not body, model, target, now, path, priority=resolution.priority
        )

    def _remember(self, snapshot: PoolSnapshot) -> None:
        """Keep the pods of the newest snapshot that had any (its healthy ones, if it had such): where
        FailOpen sends requests when no fresh snapshot is left and the config lists no endpoints (a
        pool discovered in Kubernetes)."""
        self._last_seen = snapshot
        healthy = tuple(pod.address for pod in snapshot.pods if pod.healthy)
        if healthy or snapshot.pods:
            self._last_known = healthy or tuple(pod.address for pod in snapshot.pods)

    def release(self, routing: Routing) -> None:
        """The request ``routing`` sent is over (its stream closed)."""
        if self._assignments is not None:
            self._assignments.release(routing.endpoint, routing.assigned_at)

    def _pick(
        self, request: SchedulingRequest, model: str, target: str, explain: bool
    ) -> tuple[str, str, float, str]:
        """The endpoint, the decision's ``result`` label, the time of the decision and, with
        ``explain``, the path taken."""
        snapshot = self._source.current()
        if snapshot is not self._last_seen and snapshot is not None:
            self._remember(snapshot)
        now = self._clock()
        if snapshot is not None and now - snapshot.published_at > self._max_staleness:
            snapshot = None  # the collector (or Redis) has gone quiet: the failure mode decides
        pods, stale = self._usable.get(snapshot, now) if snapshot else ((), True)
        if not pods:
            fallback = self._endpoints or self._last_known
            if self._fail_open and fallback:
                endpoint = fallback[self._rng.randrange(len(fallback))]
                return endpoint, "fail_open", now, f"no fresh pods; failureMode FailOpen; picked {endpoint}"
            why = "no fresh pool snapshot" if snapshot is None else "the pool has no pods"
            raise errors.NoEndpoints(why, model=model, target=target)
        self._decisions += 1
        timed = self._decisions % PLUGIN_TIMING_EVERY == 0
        trace = DecisionTrace(self._timer) if explain or timed else None
        start = self._timer()
        recent = 0
        if self._assignments is not None:
            pods = self._assignments.adjust(pods, self._usable.index, not_before=now - self._max_staleness)
            if explain:
                recent = sum(self._assignments.pending().values())
        if self._backlog is not None and self._targets is not None:
            request = dataclasses.replace(
                request,
                pending_prefill=self._backlog.pending(now),
                recent_targets=self._targets.seen(request.target_model, now),
            )
        outcome = self._scheduler.schedule(request, pods, trace)
        self._metrics.scheduled(self._timer() - start)
        path = ""
        if trace is not None:
            if timed:
                self._metrics.filters_timed(trace.steps)
            if explain:
                done = (
                    f"dropped ({outcome.reason})"
                    if isinstance(outcome, Drop)
                    else f"picked {outcome.address}"
                )
                path = trace.describe(pods=len(pods), recent=recent, stale=stale, outcome=done)
        if isinstance(outcome, Drop):
            raise errors.NoCapacity(outcome.reason, model=model, target=target, explain=path)
        if self._assignments is not None:
            self._assignments.record(outcome.address, now)
        if self._backlog is not None:
            self._backlog.record(outcome.address, request.prompt_tokens, now)
        return outcome.address, "picked_stale" if stale else "picked", now, path
