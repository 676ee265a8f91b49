"""How long a pod is expected to take to start answering a request sent to it now, from what was
measured: the time from each request's dispatch to its response headers, per pod and target model.

The estimate is TCP's retransmission timer's (RFC 6298): a smoothed mean
(``ALPHA``) and a smoothed mean deviation (``BETA``) of the observed waits, and the expected wait the
mean plus ``DEVIATIONS`` deviations. The deviation is the margin: a pod whose waits spread (an adapter
load now and then, a queue that comes and goes) is expected to take longer than its mean, one whose
waits hold steady close to it.

Kept per pod, target model (an adapter, or the base model) and whether the pod ran the target when
the request was sent (its snapshot's running adapters) first: on pods with few adapter slots, a
request for an adapter the pod does not run waits for a slot and a load, while one for the adapter it
runs goes into the batch (in the overload soak, 15 of the 16 answers past 6 s were of the target
split over four adapters, on pods of one slot). A key not answered yet takes the pod's estimate (all
its requests), a pod with no observation the pool's (every pod's), a pool with none ``default``.

Pure: the observations come in as seconds; no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TypeVar

ALPHA = 1 / 8  # RFC 6298's gains: ~8 observations of memory for the mean
BETA = 1 / 4
DEVIATIONS = 4.0  # RFC 6298's K: the tail of a one-slot pod's waits (an adapter load behind others) is long
MAX_KEYS = 16384  # pods, and pods x targets, kept; past it the one observed longest ago goes


@dataclass(slots=True)
class Smoothed:
    """A smoothed mean and mean deviation, RFC 6298's SRTT and RTTVAR."""

    mean: float
    deviation: float

    @classmethod
    def first(cls, seconds: float) -> Smoothed:
        return cls(seconds, seconds / 2)

    def add(self, seconds: float) -> None:
        self.deviation += BETA * (abs(self.mean - seconds) - self.deviation)
        self.mean += ALPHA * (seconds - self.mean)

    def expected(self, deviations: float) -> float:
        return self.mean + deviations * self.deviation


class PodWaits:
    def __init__(self, default: float, *, deviations: float = DEVIATIONS, max_keys: int = MAX_KEYS) -> None:
        self.default = default
        self._deviations = deviations
        self._max_keys = max_keys
        self._pods: OrderedDict[str, Smoothed] = OrderedDict()
        self._targets: OrderedDict[tuple[str, str, bool], Smoothed] = OrderedDict()
        self._pool: Smoothed | None = None

    def observe(self, address: str, seconds: float, target: str = "", slotted: bool = False) -> None:
        """A request for ``target`` sent to ``address`` (``slotted``: which ran the target then) started
        to be answered ``seconds`` after its dispatch."""
        seconds = max(seconds, 0.0)
        _add(self._pods, address, seconds, self._max_keys)
        _add(self._targets, (address, target, slotted), seconds, self._max_keys)
        if self._pool is None:
            self._pool = Smoothed.first(seconds)
        else:
            self._pool.add(seconds)

    def expected(self, address: str, target: str = "", slotted: bool = False) -> float:
        """The wait a request for ``target`` sent to ``address`` now (``slotted``: which runs the target
        now) is expected to have before its answer starts."""
        known = self._targets.get((address, target, slotted)) or self._pods.get(address) or self._pool
        return known.expected(self._deviations) if known is not None else self.default


K = TypeVar("K")


def _add(kept: OrderedDict[K, Smoothed], key: K, seconds: float, most: int) -> None:
    found = kept.get(key)
    if found is None:
        kept[key] = Smoothed.first(seconds)
        if len(kept) > most:
            kept.popitem(last=False)  # the one observed longest ago
    else:
        found.add(seconds)
        kept.move_to_end(key)
