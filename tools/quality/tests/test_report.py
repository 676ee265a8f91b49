"""Targets checked against results, and the files the report writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from quality_builders import scenario, stats

from pointsman_quality import report
from pointsman_quality.scenario import Target
from pointsman_quality.sweep import Capacity, VariantResult
from pointsman_shared.stats import PERCENTILE_RULE_TEXT


def result() -> VariantResult:
    return VariantResult(
        "v4",
        capacity={
            "best": Capacity(400.0),
            "ref": Capacity(300.0),
            "rr": Capacity(20.0, lower_bound_only=True),
        },
        levels=[
            (0.5, {"best": stats(ttft_p90_s=0.1), "ref": stats(ttft_p90_s=0.2), "rr": stats(ttft_p90_s=9.0)}),
            (
                0.9,
                {"best": stats(ttft_p90_s=0.3), "ref": stats(ttft_p90_s=0.25), "rr": stats(ttft_p90_s=20.0)},
            ),
        ],
    )


def target(**values) -> Target:
    return Target.model_validate({"contender": "best", **values})


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"metric": "capacity", "than": "rr", "atLeast": 4}, [(None, True)]),
        ({"metric": "capacity", "than": "ref", "atLeast": 2}, [(None, False)]),
        ({"metric": "ttft_p90_s", "than": "ref", "atMost": 0.8}, [(0.5, True), (0.9, False)]),
        ({"metric": "ttft_p90_s", "than": "ref", "atMost": 0.8, "levels": [0.85, 0.95]}, [(0.9, False)]),
        ({"metric": "ttft_p90_s", "best": "lowest"}, [(0.5, True), (0.9, False)]),
        ({"metric": "tokens_per_s", "than": "others", "atLeast": 1.0}, [(0.5, True), (0.9, True)]),
        ({"metric": "ttft_p90_s", "than": "others", "atMost": 1.0}, [(0.5, True), (0.9, False)]),
        ({"metric": "adapter_loads", "best": "highest"}, [(0.5, True), (0.9, True)]),
    ],
)
def test_targets_are_checked_per_level_or_once_for_capacity(values, expected) -> None:
    checks = report.check(target(**values), result())
    assert [(c.level, c.met) for c in checks] == expected


def test_a_target_of_a_contender_not_run_checks_nothing() -> None:
    assert report.check(Target(contender="ghost", metric="capacity", best="highest"), result()) == []


def test_the_summary_has_the_shape_other_tools_read() -> None:
    doc = report.summary(scenario(), result())
    assert set(doc) == {"percentile_rule", "scenario", "variant", "pods", "capacity_rps", "levels"}
    assert doc["percentile_rule"] == "nearest-rank"
    assert doc["capacity_rps"] == {"best": 400.0, "ref": 300.0, "rr": 20.0}
    level = doc["levels"][0]
    assert level["load"] == 0.5
    assert set(level["contenders"]["best"]) == set(report.SUMMARY_FIELDS)
    assert level["contenders"]["best"]["adapter_loads"] == 4  # from disk and from CPU


def test_write_makes_the_markdown_the_json_the_summary_and_the_plots(tmp_path: Path) -> None:
    s = scenario(
        variants=[{"name": "v4"}],
        summaryVariant="v4",
        targets=[{"contender": "best", "metric": "ttft_p90_s", "than": "ref", "atMost": 0.8}],
        load={"reference": "ref"},
    )
    info = {"quick": False, "duration_s": 2.0, "runs": 9, "wall_s": 1.0}
    checks = report.write(tmp_path, s, [result()], info)
    assert [c.met for c in checks] == [True, False]
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {
        "quality-tiny.md",
        "quality-tiny.json",
        "quality-summary.json",
        "quality-tiny-v4-ttft-p90.png",
        "quality-tiny-v4-throughput.png",
    }
    text = (tmp_path / "quality-tiny.md").read_text()
    assert "## Targets: 1 of 2 checks met" in text
    assert "**missed**" in text
    assert "| rr | 20.0 (at least) | - |" in text  # no contender named round-robin here
    assert "![quality-tiny-v4-ttft-p90](quality-tiny-v4-ttft-p90.png)" in text
    assert PERCENTILE_RULE_TEXT in text
    doc = json.loads((tmp_path / "quality-tiny.json").read_text())
    assert doc["percentile_rule"] == "nearest-rank"
    assert doc["variants"][0]["capacity_is_lower_bound"] == ["rr"]
    assert [t["met"] for t in doc["targets"]] == [True, False]
    assert (tmp_path / "quality-tiny-v4-ttft-p90.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
