"""A live run replayed in virtual time over the trace the client sent, and the median over seeds."""

from __future__ import annotations

import dataclasses

from quality_builders import lora_scenario

from pointsman_quality.contenders import Contender
from pointsman_quality.timescale import time_scaled
from pointsman_quality.virtual_replay import median_stats, virtual_run
from pointsman_sim.engine import EngineConfig
from pointsman_sim.fleet import TraceRequest


def test_median_stats_and_virtual_run_over_a_given_trace_after_the_warmup() -> None:
    sc = lora_scenario()
    engines = [time_scaled(EngineConfig(max_loras=4), 5.0)] * 4
    trace = [TraceRequest(0.2 * i, 50, 10, f"hot-{i % 5}") for i in range(30)]
    runs = [virtual_run(sc, Contender("round-robin", None), engines, trace, 5.0, seed) for seed in range(3)]
    assert all(r.requests == r.finished == 30 for r in runs)
    median = median_stats(runs)
    assert median["ttft_p50_s"] == sorted(r.ttft_p50_s for r in runs)[1]
    one_adapter = [dataclasses.replace(r, adapter="hot-0") for r in trace]
    rr = Contender("round-robin", None)
    whole = virtual_run(sc, rr, engines, one_adapter, 5.0)
    later = virtual_run(sc, rr, engines, one_adapter, 5.0, since=2.0)
    assert later.requests == later.finished == 20
    # The first request on each pod pays the adapter's load from disk (5 x slower); later ones do not.
    assert later.ttft_p90_s < whole.ttft_p90_s
    assert later.adapter_loads_disk == whole.adapter_loads_disk == 4  # the whole run's
