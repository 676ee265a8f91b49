"""The fleet the live bench starts: the scenario as it runs live, and the simulator pods' flags."""

from __future__ import annotations

from collections.abc import Sequence

from pointsman_quality.scenario import Scenario, ScenarioError
from pointsman_sim.engine import EngineConfig


def live_scenario(scenario: Scenario, pods: int | None = None) -> Scenario:
    """The scenario the live bench runs: ``pods`` pods if given. One simulator process serves every
    pod with one engine config, so per-pod engine values cannot be run live."""
    if scenario.fleet.per_pod:
        raise ScenarioError("fleet.perPod", [("fleet.perPod", "the live bench runs one engine config")])
    if pods is None or pods == scenario.fleet.pods:
        return scenario
    if pods < 1:
        raise ValueError(f"pods must be at least 1, got {pods}")
    return scenario.model_copy(update={"fleet": scenario.fleet.model_copy(update={"pods": pods})})


def sim_args(
    config: EngineConfig, *, profile: str, model: str, adapters: Sequence[str], speedup: float
) -> list[str]:
    """``pointsman-sim`` flags (all but ``--host`` / ``--ports``) whose pods run ``config`` (the
    profile's engine with the scenario's values) at ``speedup``."""
    args = ["--profile", profile, "--model", model, "--speedup", repr(speedup)]
    if adapters:
        args += ["--adapters", ",".join(adapters)]
    args += ["--max-loras", str(config.max_loras), "--max-num-seqs", str(config.max_num_seqs)]
    args += ["--max-num-batched-tokens", str(config.max_num_batched_tokens)]
    args += ["--num-gpu-blocks-override", str(config.num_gpu_blocks)]
    args += ["--max-model-len", str(config.max_model_len)]
    if config.max_cpu_loras is not None:
        args += ["--max-cpu-loras", str(config.max_cpu_loras)]
    return args
