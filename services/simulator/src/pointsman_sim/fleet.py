"""The virtual-time driver: a fleet of engines, an arrival trace and a routing function, no clock.

A discrete-event loop over three kinds of event, in time order: a request arrives (the router picks
its pod from the pods' latest snapshots; the request is queued there at once), a pod's step ends (its
finished requests are recorded and its next step starts at the same instant), and a snapshot round
(every ``snapshot_interval`` seconds, like the collector's scrape loop, each pod's snapshot is
refreshed from its engine). Routing thus sees metrics up to one interval old, as it does live.

A router may also :data:`HOLD` a request (a gateway's flow control) and place it later: ``dispatch``
is asked after every arrival, every snapshot round and every step that finished requests, and
returns the held requests it places (or sheds) then. A held request's time to first token counts
from its arrival, its wait included.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pointsman_shared.snapshot import PodSnapshot
from pointsman_sim.engine import BLOCK_SIZE, Engine, EngineConfig, FinishedRequest, RequestRejected, Totals
from pointsman_sim.prefix import Span, spans_block_hashes

DEFAULT_SNAPSHOT_INTERVAL = 0.05


@dataclass(frozen=True, slots=True)
class TraceRequest:
    arrival: float
    """Seconds from the start of the run."""
    prompt_tokens: int
    max_tokens: int
    adapter: str | None = None
    tokens: tuple[Span, ...] = ()
    """The request's token ids as spans (``pointsman_sim.prefix``): the whole prompt, then as much of
    the output as is known (a conversation's next turn repeats this turn's answer). None: tokens shared
    with no other request."""

    tenant: str | None = None
    """Who sent it (a gateway's fairness id)."""
    objective: str | None = None
    """The InferenceObjective it names (its priority: negative is sheddable)."""

    def __post_init__(self) -> None:
        described = sum(span.length for span in self.tokens)
        if self.tokens and not self.prompt_tokens <= described <= self.prompt_tokens + self.max_tokens:
            raise ValueError(
                f"spans of {described} tokens for a prompt of {self.prompt_tokens} and "
                f"{self.max_tokens} output tokens: they must cover the prompt and no more than the output"
            )


@dataclass(frozen=True, slots=True)
class Placement:
    """A pod, and the adapter it is to serve when the router rewrote the request's model."""

    pod: int
    adapter: str | None


class Hold(enum.Enum):
    HOLD = "hold"


HOLD = Hold.HOLD
"""What a router returns for a request it holds, to place it through ``dispatch`` later."""

Router = Callable[[TraceRequest, Sequence[PodSnapshot]], "int | Placement | Hold | None"]
"""Picks the pod that serves a request (its index, or a :class:`Placement`), from every pod's latest
snapshot; ``None`` sheds the request (a gateway's 429); :data:`HOLD` keeps it for ``dispatch``."""

Dispatch = Callable[[float, Sequence[PodSnapshot]], "Sequence[tuple[TraceRequest, int | Placement | None]]"]
"""Told the time and the pods' latest snapshots; returns held requests with their choice, to place now."""

FinishSink = Callable[[int, "Served"], None]
"""Told each request that ends, by its index in the trace, at the moment it ends."""

FirstTokenSink = Callable[[int, float], None]
"""Told each request's first token, by its index in the trace and its time, once the run reaches it
(a live picker sees the response headers then)."""


@dataclass(frozen=True, slots=True)
class Served:
    """A finished request and the pod that served it."""

    pod: int
    request: FinishedRequest


@dataclass(frozen=True, slots=True)
class FleetResult:
    served: tuple[Served, ...]
    rejected: int
    """Requests the chosen pod could never run (too long, LoRA disabled)."""
    shed: int
    """Requests the router shed (returned ``None`` for)."""
    totals: tuple[Totals, ...]
    """Per pod."""
    ended_at: float
    """When the last request finished."""


_ARRIVAL, _STEP_END, _SNAPSHOT = 0, 1, 2  # at equal times: arrivals queue before a step starts


def pod_snapshot(address: str, engine: Engine, now: float) -> PodSnapshot:
    """What the collector would publish for this engine at ``now`` (the prefix-cache hit rate since the
    start, where the collector's is over its window)."""
    return PodSnapshot(
        address=address,
        waiting=engine.waiting_count,
        running=engine.running_count,
        kv_cache_usage=engine.kv_usage,
        prefix_cache_hit_rate=engine.prefix_cache_hit_rate,
        block_size=BLOCK_SIZE,
        num_gpu_blocks=engine.config.num_gpu_blocks,
        max_lora=engine.max_loras,
        running_adapters=engine.running_adapters,
        waiting_adapters=engine.waiting_adapters,
        updated_at=now,
    )


def run_fleet(
    configs: Sequence[EngineConfig],
    trace: Sequence[TraceRequest],
    router: Router,
    *,
    snapshot_interval: float = DEFAULT_SNAPSHOT_INTERVAL,
    on_finish: FinishSink | None = None,
    dispatch: Dispatch | None = None,
    on_start: Callable[[Sequence[Engine]], None] | None = None,
    on_first_token: FirstTokenSink | None = None,
) -> FleetResult:
    """Run the trace (sorted by arrival) through one engine per config until every request ends;
    ``on_finish`` hears of each request as it ends (a router that counts in-flight requests);
    ``dispatch`` places the requests the router held; ``on_first_token`` hears of each request's first
    token when the run reaches its time (a router that measures its pods' waits); ``on_start`` is
    handed the engines before the first arrival (a router that reads them: a bound of what routing can
    achieve, not a router one could deploy)."""
    if snapshot_interval <= 0:
        raise ValueError(f"snapshot_interval must be positive, got {snapshot_interval}")
    engines = [Engine(config) for config in configs]
    if on_start is not None:
        on_start(engines)
    addresses = [f"pod-{i}" for i in range(len(engines))]
    snapshots = [
        pod_snapshot(address, engine, 0.0) for address, engine in zip(addresses, engines, strict=True)
    ]
    stepping = [False] * len(engines)
    served: list[Served] = []
    rejected = shed = 0
    order = itertools.count()
    events: list[tuple[float, int, int, int]] = [
        (r.arrival, _ARRIVAL, next(order), i) for i, r in enumerate(trace)
    ]
    heapq.heapify(events)
    last_arrival = max((r.arrival for r in trace), default=0.0)
    heapq.heappush(events, (snapshot_interval, _SNAPSHOT, next(order), 0))
    now = 0.0
    held: dict[int, int] = {}  # id() of a held trace request -> its index
    # First tokens of steps already computed, told once the run reaches them: (time, index).
    first_tokens: list[tuple[float, int]] = []
    begun: set[str] = set()  # request ids with a first token

    def start_step(pod: int, at: float) -> bool:
        """Step ``pod`` from ``at``; whether requests finished."""
        engine = engines[pod]
        ended = False
        while engine.has_work:
            result = engine.step(at)
            if on_first_token is not None:
                for rid in result.tokens:
                    if rid not in begun:
                        begun.add(rid)
                        heapq.heappush(first_tokens, (result.ends_at, int(rid[1:])))
            for finished in result.finished:
                begun.discard(finished.request_id)
                ended = True
                index = int(finished.request_id[1:])
                if finished.arrived_at != trace[index].arrival:  # held: its wait counts
                    finished = dataclasses.replace(finished, arrived_at=trace[index].arrival)
                done = Served(pod, finished)
                served.append(done)
                if on_finish is not None:
                    on_finish(index, done)
            if result.duration:
                stepping[pod] = True
                heapq.heappush(events, (result.ends_at, _STEP_END, next(order), pod))
                return ended
        stepping[pod] = False
        return ended

    def place(index: int, choice: int | Placement | None) -> None:
        nonlocal shed, rejected
        if choice is None:
            shed += 1
            return
        request = trace[index]
        pod, adapter = (choice, request.adapter) if isinstance(choice, int) else (choice.pod, choice.adapter)
        # Hashed for the adapter that serves it: a router that rewrote the model changes its blocks.
        hashes = spans_block_hashes(request.tokens, adapter, BLOCK_SIZE) if request.tokens else ()
        try:
            engines[pod].submit(f"r{index}", request.prompt_tokens, request.max_tokens, adapter, now, hashes)
        except RequestRejected:
            rejected += 1
            return
        if not stepping[pod]:
            start_step(pod, now)

    def place_held() -> None:
        if dispatch is not None and held:
            for request, choice in dispatch(now, snapshots):
                place(held.pop(id(request)), choice)

    while events:
        now, kind, _, index = heapq.heappop(events)
        while on_first_token is not None and first_tokens and first_tokens[0][0] <= now:
            at, first = heapq.heappop(first_tokens)
            on_first_token(first, at)
        if kind == _ARRIVAL:
            request = trace[index]
            choice = router(request, snapshots)
            if choice is HOLD:
                held[id(request)] = index
            else:
                place(index, choice)
            place_held()
        elif kind == _STEP_END:
            if start_step(index, now):
                place_held()
        else:
            snapshots = [pod_snapshot(a, e, now) for a, e in zip(addresses, engines, strict=True)]
            place_held()
            if now < last_arrival or held:
                heapq.heappush(events, (now + snapshot_interval, _SNAPSHOT, next(order), 0))
    return FleetResult(
        served=tuple(served),
        rejected=rejected,
        shed=shed,
        totals=tuple(engine.totals() for engine in engines),
        ended_at=max((s.request.finished_at for s in served), default=0.0),
    )


class RoundRobin:
    """Each pod in turn, whatever the snapshots say."""

    def __init__(self) -> None:
        self._next = 0

    def __call__(self, request: TraceRequest, pods: Sequence[PodSnapshot]) -> int:
        pod = self._next % len(pods)
        self._next += 1
        return pod


def least_queued(request: TraceRequest, pods: Sequence[PodSnapshot]) -> int:
    """The pod with the fewest waiting, then running, requests in its snapshot (lowest index on ties)."""
    return min(range(len(pods)), key=lambda i: (pods[i].waiting, pods[i].running))
