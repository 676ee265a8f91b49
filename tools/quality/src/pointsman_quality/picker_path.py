"""The picker's own decision path in virtual time: the :class:`~pointsman_picker.director.Director` that
the ext_proc server calls per request (model resolution, staleness, recent assignments released when
the request ends, the configured profile), with the simulator's clock and a seeded ``random.Random``.

The fleet driver refreshes every pod's snapshot each 50 ms, as the collector publishes them; this
router wraps each refresh in a :class:`~pointsman_shared.snapshot.PoolSnapshot` for an in-memory
snapshot source. No Redis, no gRPC.

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
from collections.abc import Sequence

from pointsman_picker.context import RequestContext
from pointsman_picker.director import Director
from pointsman_picker.errors import PickerError
from pointsman_picker.flowcontrol.controller import FlowController, Waiting
from pointsman_picker.interfaces import NoMetrics
from pointsman_picker.routing import Routing
from pointsman_shared.config import PointsmanConfig
from pointsman_shared.snapshot import PodSnapshot, PoolSnapshot
from pointsman_sim.fleet import HOLD, Hold, Placement, TraceRequest


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

    def __init__(self, config: PointsmanConfig, base_model: str, rng: random.Random) -> None:
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
        self._bodies: dict[tuple[str | None, int], bytes] = {}
        self.errors: dict[int, int] = {}  # HTTP status -> count
        self.flow: FlowController | None = None
        if config.flow_control.enabled:
            self.flow = FlowController(self.director, config, clock=lambda: self.now)
        self._answered: list[tuple[TraceRequest, Routing | PickerError]] = []

    def __call__(self, request: TraceRequest, pods: Sequence[PodSnapshot]) -> Placement | Hold | None:
        self.now = request.arrival
        self._see(pods)
        headers = {"x-gateway-inference-fairness-id": request.tenant} if request.tenant else {}
        context = RequestContext(
            str(id(request)), self._body(request.adapter, request.prompt_tokens), headers, request.objective
        )
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

    def _body(self, model: str | None, prompt_tokens: int) -> bytes:
        key = (model, prompt_tokens)
        body = self._bodies.get(key)
        if body is None:
            body = self._bodies[key] = request_body(model or self._base, prompt_tokens)
        return body


def request_body(model: str, prompt_tokens: int) -> bytes:
    """The body a client would send: the prompt about four characters a token, as the simulator counts
    them (so a picker that weighs prompts sees the sizes the pods will see)."""
    return json.dumps({"model": model, "prompt": "x" * (4 * prompt_tokens), "max_tokens": 1}).encode()
