"""``pointsman-quality`` in-process: a tiny scenario end to end, and the errors it exits 2 with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pointsman_quality.__main__ import main, parse_args, plan
from pointsman_quality.scenario import parse_scenario

PROFILES = str(Path(__file__).resolve().parents[3] / "config" / "profiles")
TINY = {
    "name": "tiny",
    "fleet": {"pods": 2, "engine": {"maxLoras": 1}},
    "traffic": {"adapters": [{"prefix": "a", "count": 2, "share": 1}]},
    "load": {"levels": [0.5], "duration": "2s", "capacity": {"startRps": 4, "precision": 0.3}},
    "quick": {"levels": [0.5], "duration": "1s"},
    "contenders": ["pointsman-423", "round-robin"],
    "targets": [{"contender": "pointsman-423", "metric": "capacity", "than": "round-robin", "atLeast": 1}],
}


def write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("quick", [False, True])
def test_a_scenario_runs_end_to_end(tmp_path: Path, quick: bool) -> None:
    out = tmp_path / "out"
    args = [
        str(write(tmp_path, TINY)),
        "--out",
        str(out),
        "--profiles-dir",
        PROFILES,
        "--jobs",
        "1",
        "--no-plots",
    ]
    assert main([*args, "--quick"] if quick else args) == 0
    doc = json.loads((out / "quality-tiny.json").read_text())
    assert doc["quick"] is quick
    assert doc["duration_s"] == (1.0 if quick else 2.0)
    assert doc["targets"][0]["met"] is True
    assert set(doc["variants"][0]["levels"][0]["contenders"]) == {"pointsman-423", "round-robin"}


def test_contenders_can_be_picked_on_the_command_line_and_targets_on_others_are_skipped(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    args = [str(write(tmp_path, TINY)), "--out", str(out), "--profiles-dir", PROFILES, "--no-plots"]
    assert main([*args, "--contenders", "pointsman-423", "--quick"]) == 0
    doc = json.loads((out / "quality-tiny.json").read_text())
    assert doc["targets"] == []
    assert list(doc["variants"][0]["capacity_rps"]) == ["pointsman-423"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"fleet": {"pods": "many"}}, "fleet.pods"),
        (
            {"targets": [{"contender": "ghost", "metric": "capacity", "best": "highest"}]},
            "targets[0].contender",
        ),
        ({"contenders": ["round-robin"]}, "load.reference"),
    ],
)
def test_a_bad_scenario_exits_2_naming_the_path(tmp_path: Path, capsys, change: dict, message: str) -> None:
    path = write(tmp_path, {**TINY, **change})
    assert main([str(path), "--out", str(tmp_path), "--profiles-dir", PROFILES]) == 2
    assert message in capsys.readouterr().err


def test_list_contenders_and_no_scenario(capsys) -> None:
    assert main(["--list-contenders"]) == 0
    assert "pointsman-423" in capsys.readouterr().out.split()
    assert main([]) == 2


def test_a_targets_run_runs_what_the_targets_need_and_says_what_it_left_out(tmp_path: Path) -> None:
    doc = {
        **TINY,
        "load": {**TINY["load"], "levels": [0.5, 1.0]},
        "contenders": ["pointsman-423", "round-robin", "random"],
        "targets": [
            {
                "contender": "round-robin",
                "metric": "ttft_p90_s",
                "than": "pointsman-423",
                "atLeast": 0.1,
                "levels": [0.9, 1.0],
            },
        ],
    }
    out = tmp_path / "out"
    args = [str(write(tmp_path, doc)), "--out", str(out), "--profiles-dir", PROFILES, "--no-plots"]
    assert main([*args, "--jobs", "1", "--targets"]) == 0
    result = json.loads((out / "quality-tiny.json").read_text())
    variant = result["variants"][0]
    assert result["duration_s"] == 2.0  # full length
    assert list(variant["capacity_rps"]) == ["pointsman-423"]
    assert variant["capacity_not_searched"] == ["round-robin"]
    assert [level["load"] for level in variant["levels"]] == [1.0]
    assert set(variant["levels"][0]["contenders"]) == {"pointsman-423", "round-robin"}
    assert [t["load"] for t in result["targets"]] == [1.0]
    assert result["targets_run"]["contenders_left_out"] == ["random"]
    assert result["targets_run"]["levels_left_out"] == [0.5]
    text = (out / "quality-tiny.md").read_text()
    assert "**A targets run** (`--targets`)" in text
    assert "left out: `random`" in text
    assert "| round-robin | not searched (--targets) |" in text


LEVELS = {"levels": [0.85, 0.95]}


@pytest.mark.parametrize(
    ("targets", "contenders", "levels", "searched"),
    [
        ([], ["pointsman-423"], [], ["pointsman-423"]),
        (
            [
                {
                    "contender": "gie-default",
                    "metric": "ttft_p90_s",
                    "than": "round-robin",
                    "atMost": 1,
                    **LEVELS,
                }
            ],
            ["pointsman-423", "gie-default", "round-robin"],
            [0.9],
            ["pointsman-423"],
        ),
        (
            [{"contender": "gie-default", "metric": "ttft_p90_s", "than": "round-robin", "atMost": 1}],
            ["pointsman-423", "gie-default", "round-robin"],
            [0.5, 0.9, 1.1],
            ["pointsman-423"],
        ),
        (  # a best-of-all or against-the-others target needs every contender
            [{"contender": "gie-default", "metric": "ttft_p90_s", "best": "lowest", **LEVELS}],
            ["pointsman-423", "gie-default", "round-robin", "random"],
            [0.9],
            ["pointsman-423"],
        ),
        (
            [
                {
                    "contender": "gie-default",
                    "metric": "tokens_per_s",
                    "than": "others",
                    "atLeast": 1,
                    **LEVELS,
                }
            ],
            ["pointsman-423", "gie-default", "round-robin", "random"],
            [0.9],
            ["pointsman-423"],
        ),
        (  # a capacity target: its contenders' capacities are searched, and it needs no level
            [{"contender": "gie-default", "metric": "capacity", "than": "round-robin", "atLeast": 1}],
            ["pointsman-423", "gie-default", "round-robin"],
            [],
            ["pointsman-423", "gie-default", "round-robin"],
        ),
        (
            [{"contender": "random", "metric": "capacity", "best": "highest"}],
            ["pointsman-423", "gie-default", "round-robin", "random"],
            [],
            ["pointsman-423", "gie-default", "round-robin", "random"],
        ),
    ],
)
def test_targets_plan_the_contenders_levels_and_searches_they_need(
    targets: list, contenders: list, levels: list, searched: list
) -> None:
    doc = {
        **TINY,
        "load": {**TINY["load"], "levels": [0.5, 0.9, 1.1]},
        "contenders": ["pointsman-423", "gie-default", "round-robin", "random"],
        "targets": targets,
    }
    planned = plan(parse_scenario(doc), parse_args(["--targets"]))
    assert planned.scenario.contenders == tuple(contenders)
    assert (list(planned.levels), planned.duration) == (levels, 2.0)
    assert list(planned.searched or ()) == searched
    assert planned.targets_run is not None
    assert planned.targets_run["levels_left_out"] == [x for x in (0.5, 0.9, 1.1) if x not in levels]


def test_targets_with_quick_cut_the_quick_plan() -> None:
    doc = {
        **TINY,
        "quick": {"levels": [0.5, 0.9], "duration": "1s"},
        "targets": [
            {
                "contender": "pointsman-423",
                "metric": "ttft_p90_s",
                "than": "round-robin",
                "atMost": 1,
                **LEVELS,
            }
        ],
    }
    planned = plan(parse_scenario(doc), parse_args(["--targets", "--quick"]))
    assert (planned.levels, planned.duration) == ((0.9,), 1.0)
