"""How fast the simulator's virtual-time driver runs a fleet: 32 pods, 100,000 requests.

ShareGPT-like requests (16 adapters and the base model, Poisson at 480 req/s) on 32 pods of the
``llama-3.1-8b-h100`` profile with 4 LoRA slots, routed to the pod with the shortest queue in its
snapshot (refreshed every 50 ms). The goal is under 2 minutes of wall time.

Prints the numbers and writes bench/results/sim_fleet.json.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import random
import time
from pathlib import Path

from pointsman_shared.stats import PERCENTILE_RULE, median
from pointsman_sim.fleet import least_queued, run_fleet
from pointsman_sim.profiles import load_profile
from pointsman_sim.traces import sharegpt_like

PODS = 32
REQUESTS = 100_000
RATE = 480.0
ADAPTERS = (None, *(f"adapter-{i}" for i in range(16)))


def main() -> None:
    config = dataclasses.replace(load_profile("llama-3.1-8b-h100").engine, max_loras=4)
    trace = sharegpt_like(random.Random(7), REQUESTS, rate=RATE, adapters=ADAPTERS)
    started = time.perf_counter()
    result = run_fleet([config] * PODS, trace, least_queued)
    wall = time.perf_counter() - started
    served = [s.request for s in result.served]
    numbers = {
        "percentile_rule": PERCENTILE_RULE,  # medians only here, named for every bench's json alike
        "pods": PODS,
        "requests": REQUESTS,
        "rate_per_s": RATE,
        "wall_seconds": round(wall, 1),
        "simulated_seconds": round(result.ended_at, 1),
        "requests_per_wall_second": round(REQUESTS / wall),
        "ttft_median_ms": round(1000 * median(r.time_to_first_token for r in served), 1),
        "e2e_median_s": round(median(r.e2e_latency for r in served), 2),
        "lora_loads_from_disk": sum(t.lora_loads_from_disk for t in result.totals),
        "preemptions": sum(t.preemptions for t in result.totals),
        "python": platform.python_version(),
    }
    print(json.dumps(numbers, indent=2))
    out = Path(__file__).parent / "results" / "sim_fleet.json"
    out.write_text(json.dumps(numbers, indent=2) + "\n")


if __name__ == "__main__":
    main()
