"""``pointsman-quality`` in-process: a tiny scenario end to end, and the errors it exits 2 with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pointsman_quality.__main__ import main

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
