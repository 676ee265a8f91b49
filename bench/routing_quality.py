"""What routing is worth, in virtual time: the simulator's fleet under three routers.

8 pods of the ``llama-3.1-8b-h100`` profile with 4 LoRA slots, 20,000 ShareGPT-like requests over 16
adapters and the base model (Poisson, 150 req/s), snapshots refreshed every 50 ms as the collector
does. Routers: round robin, the shortest queue in the snapshot, and Pointsman's scheduler (the #423
filter tree, every request critical so none is shed).

Prints TTFT and e2e percentiles and adapter loads per router; writes bench/results/routing_quality.json.
"""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
from collections.abc import Sequence
from pathlib import Path

from pointsman_picker.scheduling.scheduler import Scheduler
from pointsman_picker.scheduling.types import NoCapacity, SchedulingRequest
from pointsman_shared.config import SchedulingConfig
from pointsman_shared.snapshot import PodSnapshot
from pointsman_sim.fleet import FleetResult, RoundRobin, Router, TraceRequest, least_queued, run_fleet
from pointsman_sim.profiles import load_profile
from pointsman_sim.traces import sharegpt_like

PODS = 8
REQUESTS = 20_000
RATE = 150.0
BASE = "meta-llama/Llama-3.1-8B-Instruct"
ADAPTERS = (None, *(f"adapter-{i}" for i in range(16)))


def pointsman(rng: random.Random) -> Router:
    scheduler = Scheduler(SchedulingConfig(), rng)

    def route(request: TraceRequest, pods: Sequence[PodSnapshot]) -> int:
        target = request.adapter or BASE
        chosen = scheduler.schedule(SchedulingRequest(target_model=target, critical=True), tuple(pods))
        assert not isinstance(chosen, NoCapacity)  # critical requests are never shed
        return int(chosen.address.removeprefix("pod-"))

    return route


def summary(result: FleetResult) -> dict[str, float]:
    ttft = sorted(s.request.time_to_first_token for s in result.served)
    e2e = sorted(s.request.e2e_latency for s in result.served)

    def pct(values: list[float], p: float) -> float:
        return values[min(len(values) - 1, int(p * len(values)))]

    return {
        "ttft_p50_ms": round(1000 * statistics.median(ttft), 1),
        "ttft_p90_ms": round(1000 * pct(ttft, 0.9), 1),
        "e2e_p50_s": round(statistics.median(e2e), 3),
        "e2e_p90_s": round(pct(e2e, 0.9), 3),
        "lora_loads": sum(t.lora_loads_from_disk + t.lora_loads_from_cpu for t in result.totals),
        "simulated_seconds": round(result.ended_at, 1),
    }


def main() -> None:
    config = dataclasses.replace(load_profile("llama-3.1-8b-h100").engine, max_loras=4, max_cpu_loras=8)
    trace = sharegpt_like(random.Random(5), REQUESTS, rate=RATE, adapters=ADAPTERS)
    routers: dict[str, Router] = {
        "round_robin": RoundRobin(),
        "least_queued": least_queued,
        "pointsman_423": pointsman(random.Random(5)),
    }
    numbers = {name: summary(run_fleet([config] * PODS, trace, router)) for name, router in routers.items()}
    print(json.dumps(numbers, indent=2))
    out = Path(__file__).parent / "results" / "routing_quality.json"
    out.write_text(json.dumps(numbers, indent=2) + "\n")


if __name__ == "__main__":
    main()
