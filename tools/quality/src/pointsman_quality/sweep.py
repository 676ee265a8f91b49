"""A scenario's whole benchmark: every contender's capacity, then every contender at every load level.

Capacity is the highest arrival rate that meets the scenario's criterion (:func:`passes`: p99 TTFT
under the bound, every request served): doubling from ``startRps`` until a rate fails, then bisecting
to the scenario's precision. A probe is a run like any level run: the same duration, repeats and seeds,
no warm-up in either, and one run per contender and rate (a level at a probed rate is that probe). As
a trace at a higher rate carries the same requests sooner (:mod:`pointsman_quality.workload`), a rate's
verdict is the load's, not the luck of its own sample. Every level run is judged by the same
criterion afterwards, and one that contradicts its contender's capacity is reported
(:func:`contradictions`). Load levels are fractions of the reference contender's capacity. Runs are
independent, so they go to a process pool.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pointsman_quality.contenders import Contender
from pointsman_quality.runs import RunStats, canonical_rate, run
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
    capacity: dict[str, Capacity] = field(default_factory=dict)  # the contenders searched
    levels: list[tuple[float, dict[str, RunStats]]] = field(default_factory=list)

    @property
    def contenders(self) -> list[str]:
        """Every contender run: those whose capacity was searched, then the others of the levels."""
        return list(dict.fromkeys([*self.capacity, *(name for _, runs in self.levels for name in runs)]))


@dataclass(frozen=True, slots=True)
class CapacityMethod:
    """How the capacities of a sweep were found: the criterion, the search and the runs it judged."""

    p99_ttft_below: float
    start_rps: float
    precision: float
    duration: float
    repeats: int
    seed: int

    @classmethod
    def of(cls, scenario: Scenario, duration: float) -> CapacityMethod:
        spec = scenario.load.capacity
        return cls(
            spec.p99_ttft_below,
            spec.start_rps,
            spec.precision,
            duration,
            scenario.load.repeats,
            scenario.seed,
        )

    def text(self) -> str:
        return (
            f"capacity = the highest arrival rate with p99 TTFT under {self.p99_ttft_below:g} s and every "
            f"request served (none shed or refused), found by doubling from {self.start_rps:g} req/s until "
            f"a rate fails, then bisecting to {self.precision:.0%}; each probe is a run like a level's: "
            f"{self.duration:g} s of arrivals, {self.repeats} repeat(s) pooled (traffic and router draws "
            f"of seed {self.seed}, repeats {', '.join(map(str, range(self.repeats)))}), no warm-up; a level "
            "at a probed rate is that probe, and every level run is judged by the same criterion"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "criterion": f"ttft_p99_s < {self.p99_ttft_below:g} and unserved == 0",
            "p99_ttft_below_s": self.p99_ttft_below,
            "start_rps": self.start_rps,
            "precision": self.precision,
            "search": "double from start_rps until a rate fails, then bisect",
            "duration_s": self.duration,
            "repeats": self.repeats,
            "seeds": [f"{self.seed}:{repeat}" for repeat in range(self.repeats)],
            "warmup_s": 0.0,
            "probes_are_level_runs": True,
        }


def passes(stats: RunStats, bound: float) -> bool:
    # A run that sheds or refuses requests has not served that load.
    return stats.ttft_p99_s < bound and stats.unserved == 0


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


def contradictions(result: VariantResult, bound: float) -> dict[str, list[tuple[float, RunStats]]]:
    """Per contender, the level runs whose verdict contradicts its capacity: one passing above it
    (unless the capacity is only a lower bound) or failing at or below it; ``(level, run)`` pairs."""
    found: dict[str, list[tuple[float, RunStats]]] = {}
    for name, capacity in result.capacity.items():
        against = []
        for level, runs in result.levels:
            stats = runs.get(name)
            if stats is None:
                continue
            above = stats.rate > canonical_rate(capacity.rate)
            if (passes(stats, bound) and above and not capacity.lower_bound_only) or (
                not passes(stats, bound) and not above
            ):
                against.append((level, stats))
        if against:
            found[name] = against
    return found


class Sweep:
    """Runs a scenario's variants; ``executor`` spreads the runs over processes. ``searched``: the
    contenders whose capacity is searched (the load reference always is); default every one."""

    def __init__(
        self,
        scenario: Scenario,
        contenders: Sequence[Contender],
        executor: Executor,
        *,
        levels: Sequence[float],
        duration: float,
        searched: Collection[str] | None = None,
    ) -> None:
        self._scenario = scenario
        self._contenders = {c.name: c for c in contenders}
        self._searched = searched
        self._executor = executor
        self._levels = tuple(levels)
        self._duration = duration
        self._done: dict[tuple[str, float], Future[RunStats]] = {}  # this variant's runs
        self._lock = threading.Lock()  # the capacity searches submit from threads of their own
        self.runs = 0  # how many runs so far
        self.reused = 0  # level runs that were a probe's run

    @property
    def method(self) -> CapacityMethod:
        return CapacityMethod.of(self._scenario, self._duration)

    def _runs(self, jobs: Iterable[tuple[Contender, list[EngineConfig], float]]) -> list[RunStats]:
        futures = []
        with self._lock:
            for contender, engines, rate in jobs:
                key = (contender.name, canonical_rate(rate))
                if key in self._done:
                    self.reused += 1
                else:
                    repeats = self._scenario.load.repeats
                    self._done[key] = self._executor.submit(
                        run, self._scenario, contender, engines, rate, self._duration, repeats
                    )
                    self.runs += 1
                futures.append(self._done[key])
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
        self._done = {}  # another variant, other engines
        searched = [n for n in names if self._searched is None or n in self._searched or n == reference]
        result.capacity = self.capacities(engines, searched)
        base = result.capacity[reference].rate
        jobs = [(self._contenders[n], engines, level * base) for level in self._levels for n in names]
        stats = iter(self._runs(jobs))
        for level in self._levels:
            result.levels.append((level, {n: next(stats) for n in names}))
        for name, against in contradictions(result, self._scenario.load.capacity.p99_ttft_below).items():
            log.warning(
                "%s%s: level runs against its capacity %.1f req/s: %s",
                result.variant and f"{result.variant} / ",
                name,
                result.capacity[name].rate,
                ", ".join(
                    f"{level:g} ({s.rate:.1f} req/s, p99 TTFT {s.ttft_p99_s:.2f} s)" for level, s in against
                ),
            )
        return result
