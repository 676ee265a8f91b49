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
            "best": Capacity(
                400.0, probes=(stats(rate=200.0), stats(rate=400.0), stats(rate=800.0, unserved=5))
            ),
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


PROMPTS = {"kind": "shared-prefix", "systemPromptLen": 64, "questionLen": 16, "outputLen": 8}


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
    assert "How capacity was found: capacity = the highest arrival rate with p99 TTFT under 2 s" in text
    assert "| best | 400.0 | - | 200 ✓ 400 ✓ 800 ✗ | none |" in text
    # ref's capacity is 300, and its level runs at 10 req/s pass: they agree.
    assert "| ref | 300.0 | - | - | none |" in text
    assert "## Targets: 1 of 2 checks met" in text
    assert "**missed**" in text
    assert "| rr | 20.0 (at least) | - | - | none |" in text  # no contender named round-robin here
    assert "![quality-tiny-v4-ttft-p90](quality-tiny-v4-ttft-p90.png)" in text
    assert PERCENTILE_RULE_TEXT in text
    doc = json.loads((tmp_path / "quality-tiny.json").read_text())
    assert doc["percentile_rule"] == "nearest-rank"
    assert doc["capacity_method"]["seeds"] == ["3:0"]
    assert doc["capacity_method"]["probes_are_level_runs"] is True
    search = doc["variants"][0]["capacity_search"]
    assert [(p["rate"], p["passed"]) for p in search["best"]["probes"]] == [
        (200, True),
        (400, True),
        (800, False),
    ]
    assert search["best"]["level_runs_against"] == []
    assert doc["variants"][0]["capacity_is_lower_bound"] == ["rr"]
    assert [t["met"] for t in doc["targets"]] == [True, False]
    assert (tmp_path / "quality-tiny-v4-ttft-p90.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_level_run_against_its_capacity_is_shown(tmp_path: Path) -> None:
    got = result()
    got.levels.append((1.1, {"best": stats(rate=440.0), "ref": stats(rate=330.0, ttft_p99_s=0.3)}))
    s = scenario(load={"reference": "ref"})
    report.write(
        tmp_path, s, [got], {"quick": True, "duration_s": 2.0, "runs": 9, "wall_s": 1.0}, with_plots=False
    )
    text = (tmp_path / "quality-tiny.md").read_text()
    assert "**load 1.1 (440.0 req/s) passed**" in text  # above best's 400
    doc = json.loads((tmp_path / "quality-tiny.json").read_text())
    (run,) = doc["variants"][0]["capacity_search"]["ref"]["level_runs_against"]
    assert (run["load"], run["rate"], run["passed"]) == (1.1, 330.0, True)


@pytest.mark.parametrize(
    ("prompts", "oracle", "header", "row"),
    [
        pytest.param(
            None, False, "| 429s | finished |\n", "| 100/100 |\n", id="no-shared-prefixes: as before"
        ),
        pytest.param(
            PROMPTS, False, "| finished | prefix hit rate |\n", "| 100/100 | 0.600 |\n", id="hit-rate"
        ),
        pytest.param(
            PROMPTS,
            True,
            "| prefix hit rate | x oracle-prefix |\n",
            "| 100/100 | 0.600 | 0.75 |\n",
            id="and-as-a-fraction-of-the-bound",
        ),
    ],
)
def test_levels_show_the_prefix_hit_rate_when_prompts_share_prefixes(
    tmp_path: Path, prompts: dict[str, object] | None, oracle: bool, header: str, row: str
) -> None:
    runs = {"best": stats(prefix_hit_rate=0.6)} | (
        {"oracle-prefix": stats(prefix_hit_rate=0.8)} if oracle else {}
    )
    got = VariantResult("", capacity={"best": Capacity(400.0)}, levels=[(0.5, runs)])
    traffic: dict[str, object] = {"baseShare": 1} | ({"prompts": prompts} if prompts else {})
    s = scenario(traffic=traffic, load={"reference": "best"})
    report.write(
        tmp_path, s, [got], {"quick": True, "duration_s": 2.0, "runs": 1, "wall_s": 1.0}, with_plots=False
    )
    text = (tmp_path / "quality-tiny.md").read_text()
    assert header in text
    assert any(line.startswith("| best |") and (line + "\n").endswith(row) for line in text.splitlines())
