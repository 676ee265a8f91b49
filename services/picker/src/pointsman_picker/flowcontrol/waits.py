"""How long a pod is expected to take to start answering a request sent to it now, from what was
measured: the time from each request's dispatch to its response headers, per pod.

The estimate is TCP's retransmission timer's (RFC 6298) with a smaller margin: a smoothed mean
(``ALPHA``) and a smoothed mean deviation (``BETA``) of the observed waits, and the expected wait the
mean plus ``DEVIATIONS`` deviations. The deviation is the margin: a pod whose waits spread (an adapter
load now and then, a queue that comes and goes) is expected to take longer than its mean, one whose
waits hold steady close to it. A pod with no observation yet takes the pool's estimate (every pod's
observations together); a pool with none takes ``default``.

Pure: the observations come in as seconds; no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

ALPHA = 1 / 8  # RFC 6298's gains: ~8 observations of memory for the mean
BETA = 1 / 4
DEVIATIONS = 2.0  # RFC 6298 takes 4 for a retransmission; 2 here keeps fewer requests from the pods
MAX_PODS = 4096  # addresses kept; past it, the one observed longest ago goes (pods come and go)


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

    @property
    def expected(self) -> float:
        return self.mean + DEVIATIONS * self.deviation


class PodWaits:
    def __init__(self, default: float, *, max_pods: int = MAX_PODS) -> None:
        self.default = default
        self._max_pods = max_pods
        self._pods: OrderedDict[str, Smoothed] = OrderedDict()
        self._pool: Smoothed | None = None

    def observe(self, address: str, seconds: float) -> None:
        """A request sent to ``address`` started to be answered ``seconds`` after its dispatch."""
        seconds = max(seconds, 0.0)
        pod = self._pods.get(address)
        if pod is None:
            self._pods[address] = Smoothed.first(seconds)
            if len(self._pods) > self._max_pods:
                self._pods.popitem(last=False)
        else:
            pod.add(seconds)
            self._pods.move_to_end(address)
        if self._pool is None:
            self._pool = Smoothed.first(seconds)
        else:
            self._pool.add(seconds)

    def expected(self, address: str) -> float:
        """The wait a request sent to ``address`` now is expected to have before its answer starts."""
        pod = self._pods.get(address)
        if pod is not None:
            return pod.expected
        return self._pool.expected if self._pool is not None else self.default
