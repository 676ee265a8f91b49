"""Time scaling for the live bench: two cores cannot run a fleet at its real speed, so the live pods run
``k`` times slower (``pointsman-sim --speedup 1/k``) at ``1/k`` of the arrival rate. The virtual runs
they are compared with use the same scaled engine (:func:`time_scaled`), so both measure one system,
in the same (wall) seconds.
"""

from __future__ import annotations

import dataclasses

from pointsman_sim.engine import EngineConfig

# Constants in milliseconds: k times longer. prefill_tokens_per_s is a rate: k times smaller. The LoRA
# overhead factors (alpha, beta) and the adapter rank multiply durations, so they stay.
_STEP_MS = ("fixed_ms", "per_decode_seq_ms", "per_kv_token_ms", "prefill_min_ms", "prefill_fixed_ms")
_LOAD_MS = ("disk_fixed_ms", "disk_per_rank_ms", "cpu_to_gpu_ms")


def time_scaled(config: EngineConfig, k: float) -> EngineConfig:
    """``config`` with every step and every adapter load ``k`` times longer: the engine a pod at
    ``--speedup 1/k`` runs, in wall seconds."""
    if k <= 0:
        raise ValueError(f"the time scale must be positive, got {k}")
    step = config.step_time
    load = config.lora_load
    return dataclasses.replace(
        config,
        step_time=dataclasses.replace(
            step,
            **{name: getattr(step, name) * k for name in _STEP_MS},
            prefill_tokens_per_s=step.prefill_tokens_per_s / k,
        ),
        lora_load=dataclasses.replace(load, **{name: getattr(load, name) * k for name in _LOAD_MS}),
    )
