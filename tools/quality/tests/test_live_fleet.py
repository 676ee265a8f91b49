"""The live fleet: the scenario as it runs live, and the pods' flags."""

from __future__ import annotations

import pytest
from quality_builders import lora_scenario

from pointsman_quality.live_fleet import live_scenario, sim_args
from pointsman_quality.scenario import ScenarioError, engine_configs
from pointsman_sim.__main__ import build_parser, pod_specs


def test_the_pods_the_sim_flags_start_run_exactly_the_scenarios_engine() -> None:
    sc = lora_scenario(fleet={"pods": 4, "engine": {"maxLoras": 3, "maxCpuLoras": 6, "numGpuBlocks": 5000}})
    engine = engine_configs(sc)[0]
    flags = sim_args(
        engine,
        profile=sc.fleet.profile,
        model=sc.traffic.base_model,
        adapters=["hot-0", "hot-1"],
        speedup=0.05,
    )
    spec = pod_specs(build_parser().parse_args(["--ports", "1", *flags]), [1])[0]
    assert spec.engine == engine
    assert (spec.speedup, spec.adapters, spec.model) == (0.05, ("hot-0", "hot-1"), sc.traffic.base_model)


def test_live_scenario_sets_the_pods_and_refuses_per_pod_engines() -> None:
    sc = lora_scenario()
    assert live_scenario(sc) is sc
    assert live_scenario(sc, 2).fleet.pods == 2
    per_pod = lora_scenario(fleet={"pods": 2, "perPod": [{"pods": [1], "maxLoras": 1}]})
    with pytest.raises(ScenarioError, match="one engine config"):
        live_scenario(per_pod)
