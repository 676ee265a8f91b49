from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pytest

from pointsman_shared.snapshot import PodSnapshot
from pointsman_sim.engine import Engine, EngineConfig
from pointsman_sim.fleet import HOLD, Hold, Placement, RoundRobin, TraceRequest, least_queued, run_fleet
from pointsman_sim.prefix import Span
from pointsman_sim.traces import sharegpt_like


def configs(pods: int, **overrides: object) -> list[EngineConfig]:
    return [EngineConfig(**overrides) for _ in range(pods)]  # type: ignore[arg-type]


def test_every_request_is_served_once_with_consistent_times() -> None:
    trace = sharegpt_like(random.Random(1), 300, rate=50.0, adapters=(None, "a", "b"))
    result = run_fleet(configs(3, max_loras=1), trace, RoundRobin())
    assert len(result.served) == 300
    assert result.rejected == 0
    assert Counter(s.pod for s in result.served) == {0: 100, 1: 100, 2: 100}
    for s in result.served:
        r = s.request
        assert r.arrived_at < r.first_token_at <= r.finished_at <= result.ended_at
    assert sum(t.generation_tokens for t in result.totals) == sum(r.max_tokens for r in trace)


def test_router_sees_snapshots_only_as_fresh_as_the_interval() -> None:
    seen: list[tuple[float, float]] = []

    def spy(request: TraceRequest, pods: Sequence[PodSnapshot]) -> int:
        seen.append((request.arrival, pods[0].updated_at))
        return 0

    trace = [TraceRequest(t, 16, 4) for t in (0.0, 0.07, 0.149, 0.31)]
    run_fleet(configs(1), trace, spy, snapshot_interval=0.1)
    assert seen == [(0.0, 0.0), (0.07, 0.0), (0.149, pytest.approx(0.1)), (0.31, pytest.approx(0.3))]


@pytest.mark.parametrize(("interval", "pods_used"), [(0.001, 4), (100.0, 1)])
def test_stale_snapshots_pile_requests_on_one_pod(interval: float, pods_used: int) -> None:
    # A burst within one interval: least-queued routing sees no load until the next refresh.
    trace = [TraceRequest(0.001 * i, 200, 50) for i in range(40)]
    result = run_fleet(configs(4), trace, least_queued, snapshot_interval=interval)
    assert len({s.pod for s in result.served}) == pods_used


def test_requests_a_pod_cannot_run_are_counted_as_rejected() -> None:
    trace = [TraceRequest(0.0, 100, 10), TraceRequest(0.0, 100, 10, "a")]
    result = run_fleet(configs(1, max_loras=0), trace, RoundRobin())
    assert (len(result.served), result.rejected) == (1, 1)


def test_empty_trace() -> None:
    result = run_fleet(configs(2), [], RoundRobin())
    assert (result.served, result.ended_at) == ((), 0.0)


def test_requests_the_router_sheds_are_counted_and_never_queued() -> None:
    trace = [TraceRequest(0.01 * i, 32, 4) for i in range(6)]
    result = run_fleet(configs(2), trace, lambda request, pods: None if request.arrival < 0.025 else 1)
    assert (result.shed, len(result.served), {s.pod for s in result.served}) == (3, 3, {1})


def test_on_finish_hears_each_request_by_trace_index_when_it_ends() -> None:
    trace = sharegpt_like(random.Random(2), 50, rate=20.0, adapters=(None, "a"))
    heard: list[tuple[int, float]] = []
    result = run_fleet(
        configs(2), trace, RoundRobin(), on_finish=lambda i, s: heard.append((i, s.request.finished_at))
    )
    assert sorted(i for i, _ in heard) == list(range(50))
    assert [t for _, t in heard] == sorted(t for _, t in heard)  # told in time order
    assert {s.request.finished_at for s in result.served} == {t for _, t in heard}


def test_on_first_token_hears_each_request_once_at_its_first_token_in_time_order() -> None:
    trace = sharegpt_like(random.Random(3), 50, rate=20.0, adapters=(None, "a"))
    heard: list[tuple[int, float]] = []
    result = run_fleet(configs(2), trace, RoundRobin(), on_first_token=lambda i, at: heard.append((i, at)))
    assert sorted(i for i, _ in heard) == list(range(50))
    assert [t for _, t in heard] == sorted(t for _, t in heard)
    first = {int(s.request.request_id[1:]): s.request.first_token_at for s in result.served}
    assert dict(heard) == first


def test_a_placement_serves_the_adapter_the_router_rewrote_the_request_to() -> None:
    trace = [TraceRequest(0.0, 32, 4, "public-name")]
    result = run_fleet(configs(2), trace, lambda request, pods: Placement(1, "version-2"))
    assert [(s.pod, s.request.adapter) for s in result.served] == [(1, "version-2")]


class HoldOneInTwo:
    """Holds every other request, then places (or sheds) the held ones at the first snapshot round
    after ``release_at``."""

    def __init__(self, release_at: float, shed: bool = False) -> None:
        self.release_at = release_at
        self.shed = shed
        self.held: list[TraceRequest] = []
        self.dispatched_at: dict[float, float] = {}  # by arrival

    def __call__(self, request: TraceRequest, pods: Sequence[PodSnapshot]) -> int | Hold:
        if int(request.arrival * 100) % 2:
            self.held.append(request)
            return HOLD
        return 0

    def dispatch(self, now: float, pods: Sequence[PodSnapshot]) -> list[tuple[TraceRequest, int | None]]:
        if now < self.release_at:
            return []
        out, self.held = self.held, []
        for request in out:
            self.dispatched_at[request.arrival] = now
        return [(request, None if self.shed else 0) for request in out]


def test_a_held_request_is_placed_later_and_its_wait_counts_in_its_ttft() -> None:
    trace = [TraceRequest(t / 100, 16, 4) for t in range(10)]  # 0.00 .. 0.09; odd hundredths held
    router = HoldOneInTwo(release_at=0.5)
    result = run_fleet(configs(1), trace, router, dispatch=router.dispatch, snapshot_interval=0.1)
    assert len(result.served) == 10
    assert sorted(router.dispatched_at) == [pytest.approx(t / 100) for t in (1, 3, 5, 7, 9)]
    for served in result.served:
        arrival = trace[int(served.request.request_id[1:])].arrival
        assert served.request.arrived_at == arrival  # the trace's arrival, not the dispatch
        if arrival in router.dispatched_at:
            assert served.request.first_token_at >= router.dispatched_at[arrival] >= 0.5


def test_held_requests_keep_the_snapshot_rounds_going_until_placed_or_shed() -> None:
    trace = [TraceRequest(t / 100, 16, 4) for t in range(4)]
    router = HoldOneInTwo(release_at=3.0, shed=True)  # long after the last arrival
    result = run_fleet(configs(1), trace, router, dispatch=router.dispatch, snapshot_interval=0.1)
    assert (len(result.served), result.shed) == (2, 2)


SYSTEM = Span(1, 512)


@pytest.mark.parametrize(
    ("adapters", "hits"),
    [
        pytest.param((None, None), 512, id="same-system-prompt"),
        pytest.param((None, "a"), 0, id="rewritten-to-an-adapter"),
        pytest.param(("a", "a"), 512, id="same-adapter"),
    ],
)
def test_spans_reach_the_engine_hashed_for_the_adapter_that_serves(
    adapters: tuple[str | None, str | None], hits: int
) -> None:
    # Two requests on one pod, the second after the first ended; the router places each as listed.
    trace = [TraceRequest(10.0 * i, 544, 8, None, (SYSTEM, Span(10 + i, 32))) for i in range(2)]
    placements = iter(Placement(0, adapter) for adapter in adapters)
    result = run_fleet([EngineConfig(max_loras=1)], trace, lambda r, pods: next(placements))
    (totals,) = result.totals
    assert (totals.prefix_cache_queries, totals.prefix_cache_hits) == (2 * 544, hits)


def test_the_oracle_hook_gets_the_engines_and_snapshots_carry_the_cache() -> None:
    seen: list[Sequence[Engine]] = []
    trace = [TraceRequest(0.1 * i, 544, 8, None, (SYSTEM, Span(10 + i, 32))) for i in range(20)]
    snapshots: list[PodSnapshot] = []

    def router(request: TraceRequest, pods: Sequence[PodSnapshot]) -> int:
        snapshots.extend(pods)
        return 0

    run_fleet([EngineConfig(num_gpu_blocks=500)] * 2, trace, router, on_start=seen.append)
    assert [len(engines) for engines in seen] == [2]
    assert {(p.block_size, p.num_gpu_blocks) for p in snapshots} == {(16, 500)}
    assert snapshots[-2].prefix_cache_hit_rate == pytest.approx(19 * 512 / (20 * 544), rel=0.1)
    assert snapshots[-1].prefix_cache_hit_rate is None  # pod 1 served nothing


@pytest.mark.parametrize("described", [543, 553], ids=["short-of-the-prompt", "beyond-the-output"])
def test_spans_cover_the_prompt_and_no_more_than_the_output(described: int) -> None:
    with pytest.raises(ValueError, match="must cover the prompt"):
        TraceRequest(0.0, 544, 8, None, (Span(1, described),))
