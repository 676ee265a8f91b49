"""A live run's requests as the client saw them (:class:`RequestResult`, from either client) and the
run's figures, taken as the virtual runs take theirs (:func:`live_stats`), how late the client
sent (:func:`send_lag`), and the pods' prefix-cache counters (:func:`prefix_cache_totals`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pointsman_quality.runs import latency_figures
from pointsman_shared.stats import percentile
from pointsman_sim.fleet import TraceRequest


@dataclass(frozen=True, slots=True)
class RequestResult:
    """One live request as the client saw it; times in seconds (the client's clock)."""

    ok: bool
    start: float
    end: float
    ttft: float | None = None
    tpot: float | None = None
    output_tokens: int = 0
    model: str | None = None
    error: str | None = None
    prompt_tokens: int | None = None  # as sent (inference-perf's requests: to match them to the trace)
    max_tokens: int | None = None

    @property
    def e2e(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class LiveStats:
    """A live run's figures, named as :class:`~pointsman_quality.runs.RunStats`'s."""

    rate: float
    requests: int
    finished: int
    failed: int
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_p90_s: float
    e2e_p90_s: float
    tokens_per_s: float

    def as_dict(self) -> dict[str, float | int]:
        return dataclasses.asdict(self)


def live_stats(
    rate: float, trace: Sequence[TraceRequest], results: Sequence[RequestResult], since: float = 0.0
) -> LiveStats:
    """A live run's figures over the requests that arrived ``since`` seconds into the trace or later
    (the earlier ones warm the fleet up), taken as the virtual runs take them. The
    trace's time 0 is the first send less the first arrival; output tokens per second from ``since``
    to the last end."""
    if not results:
        return LiveStats(rate, sum(r.arrival >= since for r in trace), 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    zero = min(r.start for r in results) - (trace[0].arrival if trace else 0.0)
    requests = sum(r.arrival >= since - 1e-9 for r in trace)
    if len(results) == len(trace):
        # The k-th send is the k-th arrival (sends keep the trace's order, give or take a few ms), so
        # a request sent a hair early across ``since`` still counts once.
        arrivals = sorted(r.arrival for r in trace)
        by_send = sorted(results, key=lambda r: r.start)
        counted = [r for r, at in zip(by_send, arrivals, strict=True) if at >= since - 1e-9]
    else:
        counted = [r for r in results if r.start - zero >= since - 1e-9]
    served = [r for r in counted if r.ok]
    tokens = sum(r.output_tokens for r in served)
    span = max((r.end for r in counted), default=zero + since) - (zero + since)
    return LiveStats(
        rate=rate,
        requests=requests,
        finished=len(served),
        failed=requests - len(served),
        **latency_figures(
            (r.ttft for r in served if r.ttft is not None),
            (r.tpot for r in served if r.tpot is not None and r.output_tokens > 1),
            (r.e2e for r in served),
        ),
        tokens_per_s=tokens / span if span > 0 else 0.0,
    )


def send_lag(trace: Sequence[TraceRequest], results: Sequence[RequestResult]) -> dict[str, float]:
    """How late the client sent, in ms (p50, p99, max): the k-th send after the first against the
    k-th arrival after the first. A late client delays arrivals the virtual run makes on time."""
    arrivals = sorted(r.arrival for r in trace)
    starts = sorted(r.start for r in results)
    if not arrivals or len(starts) != len(arrivals):
        return {}
    lags = [(s - starts[0]) - (a - arrivals[0]) for s, a in zip(starts, arrivals, strict=True)]
    return {
        "p50": round(percentile(lags, 0.5) * 1000, 2),
        "p99": round(percentile(lags, 0.99) * 1000, 2),
        "max": round(max(lags) * 1000, 2),
    }


PREFIX_QUERIES, PREFIX_HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"


def prefix_cache_totals(pages: Iterable[str]) -> tuple[float, float] | None:
    """The prefix-cache queries and hits (tokens) of every pod's /metrics page in ``pages``, summed
    over pods and label sets; None when a page lacks either counter (a pod that does not export them,
    or a vLLM V0 one with only the hit-rate gauge)."""
    queries = hits = 0.0
    for page in pages:
        seen = set()
        for line in page.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name == PREFIX_QUERIES:
                queries += float(line.rsplit(" ", 1)[1])
            elif name == PREFIX_HITS:
                hits += float(line.rsplit(" ", 1)[1])
            else:
                continue
            seen.add(name)
        if len(seen) < 2:
            return None
    return queries, hits
