"""The picker's own decision path in virtual time: the :class:`~pointsman_picker.director.Director` that
the ext_proc server calls per request (model resolution, staleness, recent assignments released when
the request ends, the configured profile), with the simulator's clock and a seeded ``random.Random``.

The fleet driver refreshes every pod's snapshot each 50 ms, as the collector publishes them; this
router wraps each refresh in a :class:`~pointsman_shared.snapshot.PoolSnapshot` for an in-memory
snapshot source. No Redis, no gRPC.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence

from pointsman_picker.context import RequestContext
from pointsman_picker.director import Director
from pointsman_picker.errors import PickerError
from pointsman_picker.interfaces import NoMetrics
from pointsman_picker.routing import Routing
from pointsman_shared.config import PointsmanConfig
from pointsman_shared.snapshot import PodSnapshot, PoolSnapshot
from pointsman_sim.fleet import Placement, TraceRequest
from pointsman_sim.prefix import prompt_text


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

    def __call__(self, request: TraceRequest, pods: Sequence[PodSnapshot]) -> Placement | None:
        self.now = request.arrival
        if self._snapshots.update(pods):
            self._index = {pod.address: i for i, pod in enumerate(pods)}
        try:
            context = RequestContext(str(id(request)), self._body(request))
            routing = self.director.route(context)
        except PickerError as exc:
            self.errors[exc.status] = self.errors.get(exc.status, 0) + 1
            return None
        self._routings[id(request)] = routing
        target = routing.target or request.adapter
        return Placement(self._index[routing.endpoint], None if target == self._base else target)

    def finished(self, request: TraceRequest) -> None:
        """``request`` has ended: its ext_proc stream closes, as live."""
        routing = self._routings.pop(id(request), None)
        if routing is not None:
            self.director.release(routing)

    def _body(self, request: TraceRequest) -> bytes:
        model = request.adapter or self._base
        if request.tokens:
            # The prompt itself, so a picker that reads prompts (prefix affinity) sees what is shared;
            # not kept, as most prompts are sent once.
            return request_body(
                model, request.prompt_tokens, prompt_text(request.tokens, request.prompt_tokens)
            )
        key = (request.adapter, request.prompt_tokens)
        body = self._bodies.get(key)
        if body is None:
            body = self._bodies[key] = request_body(model, request.prompt_tokens)
        return body


def request_body(model: str, prompt_tokens: int, prompt: str | None = None) -> bytes:
    """The body a client would send: the prompt about four characters a token, as the simulator counts
    them (so a picker that weighs prompts sees the sizes the pods will see); ``prompt`` when the trace
    spells it."""
    text = "x" * (4 * prompt_tokens) if prompt is None else prompt
    return json.dumps({"model": model, "prompt": text, "max_tokens": 1}).encode()
