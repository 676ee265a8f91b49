"""Time scaling: a k-times-slower engine at a k-times-slower trace is the same run, k times longer."""

from __future__ import annotations

import dataclasses
import random

import pytest

from pointsman_quality.timescale import time_scaled
from pointsman_sim.engine import EngineConfig, LoraLoadModel, StepTimeModel
from pointsman_sim.fleet import RoundRobin, run_fleet
from pointsman_sim.traces import sharegpt_like


def test_time_scaled_engine_takes_k_times_as_long_for_every_step_and_load() -> None:
    base = EngineConfig(
        chunked_prefill=False,
        step_time=StepTimeModel(prefill_min_ms=40.0, prefill_fixed_ms=19.7, lora_overhead=0.5),
        lora_load=LoraLoadModel(rank=32),
    )
    k = 7.5
    scaled = time_scaled(base, k)
    rng = random.Random(1)
    for _ in range(50):
        shape = {
            "decoding": rng.randrange(300),
            "kv_tokens": rng.randrange(100_000),
            "prefill_tokens": rng.randrange(8192),
            "adapters": rng.randrange(5),
        }
        assert scaled.step_time.step_seconds(**shape) == pytest.approx(
            k * base.step_time.step_seconds(**shape)
        )
        prefill = {"prefill_tokens": shape["prefill_tokens"], "adapters": shape["adapters"]}
        assert scaled.step_time.prefill_step_seconds(**prefill) == pytest.approx(
            k * base.step_time.prefill_step_seconds(**prefill)
        )
    for from_disk in (True, False):
        assert scaled.lora_load.seconds(from_disk=from_disk) == pytest.approx(
            k * base.lora_load.seconds(from_disk=from_disk)
        )
    # Nothing but time changes: capacities, the LoRA factors and the rank stay.
    unchanged = dataclasses.replace(scaled, step_time=base.step_time, lora_load=base.lora_load)
    assert unchanged == base
    assert scaled.lora_load.rank == 32
    assert scaled.step_time.lora_overhead == 0.5
    with pytest.raises(ValueError, match="positive"):
        time_scaled(base, 0)


def test_a_k_times_slower_fleet_at_a_k_times_slower_trace_is_the_same_run_in_k_times_the_time() -> None:
    k = 4.0
    trace = sharegpt_like(random.Random(5), 60, rate=30.0, adapters=(None, "a", "b"))
    slow = [dataclasses.replace(r, arrival=r.arrival * k) for r in trace]
    configs = [EngineConfig(max_loras=2)] * 2
    fast_run = run_fleet(configs, trace, RoundRobin())
    slow_run = run_fleet([time_scaled(c, k) for c in configs], slow, RoundRobin())
    fast = {s.request.request_id: s.request.time_to_first_token for s in fast_run.served}
    slowed = {s.request.request_id: s.request.time_to_first_token for s in slow_run.served}
    assert slowed.keys() == fast.keys()
    for request_id, ttft in fast.items():
        assert slowed[request_id] == pytest.approx(k * ttft)
