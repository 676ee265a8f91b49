"""CPU per observation of the collector's scrape-duration histogram: prometheus_client's
``Histogram.observe`` (what the collector uses) against a plain recorder (a bisect into the bounds and
two additions, no lock: what the collector used until 2026-12-01, reading prometheus_client's privates
to expose it the same way).

A scrape makes one observation, so the difference is per scrape; set it against a scrape's CPU from
``make bench-collector`` (``paced_cpu_us_per_scrape``, ``flat_out_cpu_us_per_scrape``).

    .venv/bin/python bench/decisions/histogram.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from bisect import bisect_left
from collections.abc import Callable
from importlib.metadata import version

from prometheus_client import CollectorRegistry, Histogram

from pointsman_collector.metrics import _SCRAPE_BUCKETS

# Scrape durations as a LAN's: most in the lower buckets, a few slow ones.
DURATIONS = [0.0003, 0.0012, 0.004, 0.0009, 0.02, 0.0015, 0.0007, 0.3] * 250


class PlainRecorder:
    """The recorder that was: the first bound >= the value, as ``Histogram.observe`` picks it."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self._bounds = (*buckets, math.inf)
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0

    def observe(self, amount: float) -> None:
        self._counts[bisect_left(self._bounds, amount)] += 1
        self._sum += amount


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    histogram = Histogram("h_seconds", "h", buckets=_SCRAPE_BUCKETS, registry=CollectorRegistry())
    observers: dict[str, Callable[[float], None]] = {
        "prometheus_client_histogram": histogram.observe,
        "plain_recorder": PlainRecorder(_SCRAPE_BUCKETS).observe,
    }
    best = dict.fromkeys(observers, float("inf"))
    for _ in range(args.repeats):
        for name, observe in observers.items():  # turns, so both see the same moments of the machine
            began = time.process_time()
            for amount in DURATIONS:
                observe(amount)
            best[name] = min(best[name], (time.process_time() - began) / len(DURATIONS) * 1e6)
    result = {
        "prometheus_client": version("prometheus_client"),
        "us_per_observe": {name: round(us, 3) for name, us in best.items()},
        "difference_us_per_scrape": round(best["prometheus_client_histogram"] - best["plain_recorder"], 3),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
