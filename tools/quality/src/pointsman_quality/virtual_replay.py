"""The virtual side of the live bench: a live run replayed in virtual time with the requests the client
sent, its figures over the requests counted live, and the median over router seeds.
"""

from __future__ import annotations

from collections.abc import Sequence

from pointsman_quality.contenders import Contender, EngineReader
from pointsman_quality.runs import RunStats, prefix_hit_rate, served_figures
from pointsman_quality.scenario import Scenario
from pointsman_shared.stats import median
from pointsman_sim.engine import EngineConfig
from pointsman_sim.fleet import DEFAULT_SNAPSHOT_INTERVAL, FleetResult, TraceRequest, run_fleet


def virtual_run(
    scenario: Scenario,
    contender: Contender,
    engines: Sequence[EngineConfig],
    trace: Sequence[TraceRequest],
    rate: float,
    seed: int = 0,
    snapshot_interval: float = DEFAULT_SNAPSHOT_INTERVAL,
    since: float = 0.0,
) -> RunStats:
    """One virtual run over a given trace (the one the live client sent), its figures over the
    requests that arrived ``since`` seconds in or later, as
    :func:`~pointsman_quality.live_stats.live_stats` counts them."""
    router = contender.router(scenario, seed)
    result = run_fleet(
        engines,
        trace,
        router,
        snapshot_interval=snapshot_interval,
        on_finish=lambda i, _served: router.finished(trace[i]),
        on_start=router.attach if isinstance(router, EngineReader) else None,
    )
    return window_stats(rate, trace, result, len(engines), since)


def window_stats(
    rate: float, trace: Sequence[TraceRequest], result: FleetResult, pods: int, since: float = 0.0
) -> RunStats:
    """:class:`~pointsman_quality.runs.RunStats` of the requests that arrived at ``since`` or later
    (adapter loads: the whole run's)."""
    counted = {f"r{i}" for i, r in enumerate(trace) if r.arrival >= since - 1e-9}
    served = [s for s in result.served if s.request.request_id in counted]
    requests = [s.request for s in served]
    per_pod = [0] * pods
    for s in served:
        per_pod[s.pod] += 1
    tokens = sum(r.output_tokens for r in requests)
    span = max((r.finished_at for r in requests), default=since) - since
    return RunStats(
        rate=rate,
        requests=len(counted),
        finished=len(served),
        rejected=len(counted) - len(served),
        **served_figures(requests),
        tokens_per_s=tokens / span if span > 0 else 0.0,
        adapter_loads_disk=sum(t.lora_loads_from_disk for t in result.totals),
        adapter_loads_cpu=sum(t.lora_loads_from_cpu for t in result.totals),
        max_pod_share=max(per_pod) / len(served) if served else 0.0,
        unserved=len(counted) - len(served),
        prefix_hit_rate=prefix_hit_rate(result.totals),
    )


def median_stats(runs: Sequence[RunStats]) -> dict[str, float]:
    """Each figure's median over runs that differ only in the router's seed (the seed moves short
    runs' percentiles by 10-20%: one run is not the expectation)."""
    if not runs:
        raise ValueError("no runs")
    fields = runs[0].as_dict()
    return {name: median(float(r.as_dict()[name]) for r in runs) for name in fields}
