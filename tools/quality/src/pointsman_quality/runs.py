"""One run: a contender routes the scenario's trace at one rate over the fleet; what came of it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TypedDict

from pointsman_quality.contenders import Contender, EngineReader, Router
from pointsman_quality.scenario import Scenario
from pointsman_quality.workload import build_trace
from pointsman_shared.stats import percentile
from pointsman_sim.engine import EngineConfig, FinishedRequest, Totals
from pointsman_sim.fleet import FinishSink, FleetResult, Served, TraceRequest, run_fleet


@dataclass(frozen=True, slots=True)
class RunStats:
    rate: float
    requests: int
    finished: int
    rejected: int  # shed by the router (429), or refused by the pod
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_p90_s: float
    e2e_p90_s: float
    tokens_per_s: float  # output tokens over the run's span
    adapter_loads_disk: int
    adapter_loads_cpu: int
    max_pod_share: float  # the busiest pod's share of the requests: how evenly the router spread
    # Requests not finished, every repeat's together: the counts above are per repeat and rounded, so a
    # single refused request in two repeats can round away; the capacity criterion reads this one.
    unserved: int
    # Prefix-cache tokens hit over tokens looked up, every pod's (whole blocks: as blocks hit over
    # blocks queried); 0 when nothing was looked up (caching off).
    prefix_hit_rate: float = 0.0

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


class LatencyFigures(TypedDict):
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_p90_s: float
    e2e_p90_s: float


def latency_figures(ttft: Iterable[float], tpot: Iterable[float], e2e: Iterable[float]) -> LatencyFigures:
    """The latency percentiles every run reports (virtual or live), by :mod:`pointsman_shared.stats`'s
    rule, 0 for no requests; ``tpot`` of the requests with more than one output token."""
    first = list(ttft)
    return {
        "ttft_p50_s": percentile(first, 0.5, empty=0.0),
        "ttft_p90_s": percentile(first, 0.9, empty=0.0),
        "ttft_p99_s": percentile(first, 0.99, empty=0.0),
        "tpot_p90_s": percentile(tpot, 0.9, empty=0.0),
        "e2e_p90_s": percentile(e2e, 0.9, empty=0.0),
    }


def served_figures(requests: Sequence[FinishedRequest]) -> LatencyFigures:
    """:func:`latency_figures` of the fleet driver's finished requests."""
    return latency_figures(
        (r.time_to_first_token for r in requests),
        (r.time_per_output_token for r in requests if r.output_tokens > 1),
        (r.e2e_latency for r in requests),
    )


def stats(rate: float, requests: int, results: Sequence[FleetResult], pods: int) -> RunStats:
    """The figures of one or more repeats of a run, their requests pooled; counts are per repeat."""
    served = [s.request for result in results for s in result.served]
    per_pod = [0] * pods
    for result in results:
        for s in result.served:
            per_pod[s.pod] += 1
    tokens = sum(r.output_tokens for r in served)
    span = sum(result.ended_at for result in results)
    n = max(1, len(results))
    return RunStats(
        rate=rate,
        requests=round(requests / n),
        finished=round(len(served) / n),
        rejected=round(sum(result.rejected + result.shed for result in results) / n),
        **served_figures(served),
        tokens_per_s=tokens / span if span else 0.0,
        adapter_loads_disk=round(sum(t.lora_loads_from_disk for r in results for t in r.totals) / n),
        adapter_loads_cpu=round(sum(t.lora_loads_from_cpu for r in results for t in r.totals) / n),
        max_pod_share=max(per_pod) / len(served) if served else 0.0,
        unserved=requests - len(served),
        prefix_hit_rate=prefix_hit_rate([t for result in results for t in result.totals]),
    )


def prefix_hit_rate(totals: Sequence[Totals]) -> float:
    """Every pod's prefix-cache hits over its queries, together."""
    queries = sum(t.prefix_cache_queries for t in totals)
    return sum(t.prefix_cache_hits for t in totals) / queries if queries else 0.0


def canonical_rate(rate: float) -> float:
    """``rate`` to nine significant digits: a level's rate (a fraction times a capacity, 1.1 x 75 =
    82.50000000000001) and a probe's at the same rate (82.5) are then one rate, one run."""
    return float(f"{rate:.9g}")


def run(
    scenario: Scenario,
    contender: Contender,
    engines: Sequence[EngineConfig],
    rate: float,
    duration: float,
    repeats: int = 1,
) -> RunStats:
    """``repeats`` samples of the traffic (each with the routers' draws of its own), pooled: one run
    of a router that locks adapters onto pods early is luck as much as policy."""
    rate = canonical_rate(rate)
    results = []
    requests = 0
    for repeat in range(repeats):
        trace = build_trace(scenario, rate, duration, repeat)
        router = contender.router(scenario, repeat)
        reader = router.attach if isinstance(router, EngineReader) else None
        results.append(
            run_fleet(
                engines,
                trace,
                router,
                on_finish=_releaser(trace, router),
                dispatch=getattr(router, "dispatch", None),
                on_start=reader,
            )
        )
        requests += len(trace)
    return stats(rate, requests, results, len(engines))


def _releaser(trace: Sequence[TraceRequest], router: Router) -> FinishSink:
    """The fleet driver's ``on_finish`` that tells ``router`` each of its requests has ended."""

    def finished(index: int, served: Served) -> None:
        router.finished(trace[index])

    return finished
