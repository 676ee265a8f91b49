"""A scenario's whole benchmark: every contender's capacity, then every contender at every load level.

Capacity is the highest arrival rate whose p99 TTFT stays under the scenario's bound: doubling from
``startRps`` until a rate fails, then bisecting to the scenario's precision. Load levels are fractions
of the reference contender's capacity. Runs are independent, so they go to a process pool.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from pointsman_quality.contenders import Contender
from pointsman_quality.runs import RunStats, run
from pointsman_quality.scenario import Scenario, Variant
from pointsman_sim.engine import EngineConfig

log = logging.getLogger(__name__)

# Doubling stops here: a contender still under the bound at this many times its start is reported as
# at least this fast.
_MAX_DOUBLINGS = 12


@dataclass(frozen=True, slots=True)
class Capacity:
    rate: float  # the highest rate found under the bound (0: even startRps / 2**k failed)
    lower_bound_only: bool = False  # the search stopped before a rate failed
    probes: tuple[RunStats, ...] = ()


@dataclass(slots=True)
class VariantResult:
    variant: str
    capacity: dict[str, Capacity] = field(default_factory=dict)
    levels: list[tuple[float, dict[str, RunStats]]] = field(default_factory=list)


def passes(stats: RunStats, bound: float) -> bool:
    # A run that sheds or refuses requests has not served that load.
    return stats.ttft_p99_s < bound and stats.rejected == 0 and stats.finished == stats.requests


def find_capacity(
    probe: Callable[[float], RunStats], start: float, bound: float, precision: float
) -> Capacity:
    """Double from ``start`` until a rate fails (or halve until one passes), then bisect."""
    probes: list[RunStats] = []

    def ok(rate: float) -> bool:
        stats = probe(rate)
        probes.append(stats)
        return passes(stats, bound)

    good, bad = 0.0, math.inf
    rate = start
    for _ in range(_MAX_DOUBLINGS):
        if not ok(rate):
            bad = rate
            break
        good, rate = rate, rate * 2
    else:
        return Capacity(good, lower_bound_only=True, probes=tuple(probes))
    if good == 0.0:
        rate = start / 2
        for _ in range(_MAX_DOUBLINGS):
            if ok(rate):
                good = rate
                break
            bad, rate = rate, rate / 2
    while good > 0 and (bad - good) / good > precision:
        middle = (good + bad) / 2
        if ok(middle):
            good = middle
        else:
            bad = middle
    return Capacity(good, probes=tuple(probes))


class Sweep:
    """Runs a scenario's variants; ``executor`` spreads the runs over processes."""

    def __init__(
        self,
        scenario: Scenario,
        contenders: Sequence[Contender],
        executor: Executor,
        *,
        levels: Sequence[float],
        duration: float,
    ) -> None:
        self._scenario = scenario
        self._contenders = {c.name: c for c in contenders}
        self._executor = executor
        self._levels = tuple(levels)
        self._duration = duration
        self.runs = 0  # how many runs so far

    def _runs(self, jobs: Iterable[tuple[Contender, list[EngineConfig], float]]) -> list[RunStats]:
        futures: list[Future[RunStats]] = [
            self._executor.submit(
                run, self._scenario, contender, engines, rate, self._duration, self._scenario.load.repeats
            )
            for contender, engines, rate in jobs
        ]
        self.runs += len(futures)
        return [f.result() for f in futures]

    def capacities(self, engines: list[EngineConfig], names: Iterable[str]) -> dict[str, Capacity]:
        """Each contender's search probes one rate at a time; the searches run side by side, so the
        process pool stays busy."""
        spec = self._scenario.load.capacity

        def search(name: str) -> Capacity:
            contender = self._contenders[name]
            found = find_capacity(
                lambda rate: self._runs([(contender, engines, rate)])[0],
                spec.start_rps,
                spec.p99_ttft_below,
                spec.precision,
            )
            log.info("%s: capacity %.1f req/s (%d probes)", name, found.rate, len(found.probes))
            return found

        names = list(names)
        with ThreadPoolExecutor(max(1, len(names))) as searches:
            return dict(zip(names, searches.map(search, names), strict=True))

    def variant(self, engines: list[EngineConfig], variant: Variant | None) -> VariantResult:
        result = VariantResult(variant.name if variant else "")
        reference = self._scenario.load.reference
        names = list(self._contenders)
        if reference not in self._contenders:
            raise ValueError(f"the reference contender {reference!r} is not among the contenders")
        result.capacity = self.capacities(engines, names)
        base = result.capacity[reference].rate
        jobs = [(self._contenders[n], engines, level * base) for level in self._levels for n in names]
        stats = iter(self._runs(jobs))
        for level in self._levels:
            result.levels.append((level, {n: next(stats) for n in names}))
        return result
