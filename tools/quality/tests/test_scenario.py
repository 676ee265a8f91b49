"""Scenario files: defaults, path-naming errors, engine configs per pod and variant."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from quality_builders import scenario

from pointsman_quality.scenario import ScenarioError, engine_configs, load_scenario, parse_scenario

SCENARIOS = sorted((Path(__file__).resolve().parents[3] / "bench" / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_the_shipped_scenarios_load(path: Path) -> None:
    assert load_scenario(path).name == path.stem


def test_the_five_scenarios_of_the_benchmark_ship() -> None:
    assert {p.stem for p in SCENARIOS} >= {"multi-lora", "bursty", "many-adapters", "base-only", "big-fleet"}


@pytest.mark.parametrize(
    ("overrides", "path", "message"),
    [
        ({"fleet": {"pods": 0}}, "fleet.pods", "greater than or equal to 1"),
        ({"fleet": {"profile": "gpt-9"}}, "fleet.profile", "unknown engine profile"),
        (
            {"fleet": {"pods": 2, "perPod": [{"pods": [5], "maxLoras": 2}]}},
            "fleet.perPod[0].pods",
            "does not exist",
        ),
        ({"fleet": {"engine": {"maxLoras": -1}}}, "fleet.engine.maxLoras", "greater than or equal to 0"),
        ({"fleet": {"engine": {"maxLora": 2}}}, "fleet.engine.maxLora", "Extra inputs"),
        (
            {"traffic": {"adapters": [{"prefix": "a", "count": 0, "share": 1}]}},
            "traffic.adapters[0].count",
            "",
        ),
        ({"traffic": {}}, "traffic", "no traffic"),
        ({"traffic": {"baseShare": 1, "arrivals": {"process": "bursty"}}}, "traffic.arrivals.process", ""),
        ({"load": {"duration": "soon"}}, "load.duration", "not a duration"),
        ({"load": {"levels": [0.5, -1]}}, "load.levels[1]", "greater than 0"),
        ({"pointsman": {"picker": {"maxStaleness": "never"}}}, "pointsman", "picker.maxStaleness"),
        (
            {"targets": [{"contender": "x", "metric": "speed", "best": "lowest"}]},
            "targets[0].metric",
            "unknown metric",
        ),
        ({"targets": [{"contender": "x", "metric": "ttft_p90_s"}]}, "targets[0]", "give `than`"),
        ({"targets": [{"contender": "x", "metric": "ttft_p90_s", "than": "y"}]}, "targets[0]", "give `than`"),
        ({"summaryVariant": "max-loras-9"}, "summaryVariant", "no variant"),
        ({"variants": [{"name": "v"}, {"name": "v"}]}, "variants", "same name"),
    ],
)
def test_invalid_scenarios_name_the_bad_path(overrides: dict, path: str, message: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        scenario(**overrides)
    assert any(p.startswith(path) and message in m for p, m in caught.value.problems), caught.value.problems


def test_a_file_that_is_not_a_mapping_or_not_yaml_is_refused(tmp_path: Path) -> None:
    (tmp_path / "list.yaml").write_text("- 1\n")
    (tmp_path / "bad.yaml").write_text("name: [\n")
    (tmp_path / "latin1.yaml").write_bytes(b"name: caf\xe9\n")
    for name, message in (
        ("list", "mapping"),
        ("bad", "not valid YAML"),
        ("latin1", "cannot read"),
        ("gone", "cannot read"),
    ):
        with pytest.raises(ScenarioError, match=message):
            load_scenario(tmp_path / f"{name}.yaml")
    with pytest.raises(ScenarioError, match="mapping"):
        parse_scenario(None)


def test_engine_configs_lay_fleet_variant_and_pod_values_in_that_order() -> None:
    s = scenario(
        fleet={
            "pods": 3,
            "engine": {"maxLoras": 2, "maxNumSeqs": 64},
            "perPod": [{"pods": [2], "maxLoras": 5}],
        },
        variants=[{"name": "three", "engine": {"maxLoras": 3}}],
    )
    plain = engine_configs(s)
    assert [c.max_loras for c in plain] == [2, 2, 5]
    assert {c.max_num_seqs for c in plain} == {64}
    assert [c.max_loras for c in engine_configs(s, s.variants[0])] == [3, 3, 5]


def test_engine_values_the_engine_refuses_name_where_they_were_set() -> None:
    s = scenario(fleet={"pods": 1, "engine": {"maxLoras": 4, "maxCpuLoras": 2}})
    with pytest.raises(ScenarioError, match="pod 0: max_cpu_loras"):
        engine_configs(s)


def test_the_format_documented_in_the_readme_parses() -> None:
    readme = (SCENARIOS[0].parent / "README.md").read_text()
    block = readme.split("```yaml\n", 1)[1].split("```", 1)[0]
    documented = parse_scenario(yaml.safe_load(block))
    assert documented.fleet.per_pod[0].pods == (6, 7)
    assert len(documented.targets) == 4
