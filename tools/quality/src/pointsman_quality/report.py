"""What a sweep found, written down: the targets checked, a Markdown report with PNG plots, and JSON.

- ``quality-SCENARIO.md``: how capacity was found; the scenario's targets, each marked met or missed;
  then per variant the capacities with each search's probes and any level run against them, the
  plots, and a table per load level.
- ``quality-SCENARIO.json``: every figure of every run, the capacity method, each search's probes.
- ``quality-summary.json``: one variant in the fixed shape other tools read (the scenario's
  ``summaryVariant``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pointsman_quality.runs import RunStats
from pointsman_quality.scenario import TARGET_METRICS, Scenario, Target
from pointsman_quality.sweep import CapacityMethod, VariantResult, contradictions, passes
from pointsman_shared.stats import PERCENTILE_RULE, PERCENTILE_RULE_TEXT

SUMMARY_FIELDS = tuple(name for name in TARGET_METRICS if name != "capacity")  # per level


OTHERS = "others"  # a target's `than`: the best of the other contenders on that metric
ORACLE = "oracle-prefix"  # the bound each contender's prefix-cache hit rate is held against


def _fraction(value: float, bound: float) -> str:
    return f"{value / bound:.2f}" if bound > 0 else "-"


def metric(stats: RunStats, name: str) -> float:
    if name == "adapter_loads":
        return stats.adapter_loads_disk + stats.adapter_loads_cpu
    value: float = getattr(stats, name)
    return value


@dataclass(frozen=True, slots=True)
class Check:
    target: Target
    variant: str
    level: float | None  # None for capacity
    value: float
    reference: float  # what the value was held against (the bound, or the best other contender's)
    met: bool

    def describe(self) -> str:
        t = self.target
        if t.best is not None:
            claim = f"{t.metric} {t.best} of all"
        else:
            word, factor = ("≤", t.at_most) if t.at_most is not None else ("≥", t.at_least)
            claim = f"{t.metric} {word} {factor:g} x {t.than}"
        return f"{t.contender}: {claim}"


def check(target: Target, result: VariantResult) -> list[Check]:
    """The target against one variant's results: one check for capacity, else one per level in range."""
    if target.metric == "capacity":
        if target.contender not in result.capacity:
            return []
        values = {name: cap.rate for name, cap in result.capacity.items()}
        return [_compare(target, result.variant, None, values)]
    return [
        _compare(target, result.variant, level, {n: metric(s, target.metric) for n, s in runs.items()})
        for level, runs in result.levels
        if target.contender in runs and target.covers(level)
    ]


def _compare(target: Target, variant: str, level: float | None, values: Mapping[str, float]) -> Check:
    value = values[target.contender]
    if target.best is not None:
        others = [v for name, v in values.items() if name != target.contender]
        if target.best == "lowest":
            reference = min(others, default=math.inf)
            met = value <= reference
        else:
            reference = max(others, default=-math.inf)
            met = value >= reference
        return Check(target, variant, level, value, reference, met)
    assert target.than is not None  # the scenario's validator makes sure
    if target.than == OTHERS:
        others = [v for name, v in values.items() if name != target.contender]
        base = (min if target.at_most is not None else max)(others, default=math.nan)
    else:
        base = values.get(target.than, math.nan)
    if target.at_most is not None:
        reference = target.at_most * base
        met = value <= reference
    else:
        assert target.at_least is not None
        reference = target.at_least * base
        met = value >= reference
    return Check(target, variant, level, value, reference, met)


def summary(scenario: Scenario, result: VariantResult) -> dict[str, Any]:
    return {
        "percentile_rule": PERCENTILE_RULE,
        "scenario": scenario.name,
        "variant": result.variant,
        "pods": scenario.fleet.pods,
        "capacity_rps": {name: round(cap.rate, 2) for name, cap in result.capacity.items()},
        "levels": [
            {
                "load": level,
                "contenders": {
                    name: {key: _round(metric(stats, key)) for key in SUMMARY_FIELDS}
                    for name, stats in runs.items()
                },
            }
            for level, runs in result.levels
        ],
    }


def _verdict(stats: RunStats, bound: float, **where: float) -> dict[str, Any]:
    return {
        **where,
        "rate": _round(stats.rate),
        "ttft_p99_s": _round(stats.ttft_p99_s),
        "unserved": stats.unserved,
        "passed": passes(stats, bound),
    }


def _searches(result: VariantResult, bound: float) -> dict[str, Any]:
    """Each contender's probes in the order run, and the level runs whose verdict contradicts its
    capacity."""
    against = contradictions(result, bound)
    return {
        name: {
            "probes": [_verdict(p, bound) for p in cap.probes],
            "level_runs_against": [_verdict(s, bound, load=level) for level, s in against.get(name, [])],
        }
        for name, cap in result.capacity.items()
    }


def full(
    scenario: Scenario, results: Sequence[VariantResult], checks: Sequence[Check], info: Mapping[str, Any]
) -> dict[str, Any]:
    method = CapacityMethod.of(scenario, info["duration_s"])
    return {
        "percentile_rule": PERCENTILE_RULE,
        "scenario": scenario.name,
        "pods": scenario.fleet.pods,
        **info,
        "capacity_method": method.as_dict(),
        "variants": [
            {
                "variant": r.variant,
                "capacity_rps": {n: round(c.rate, 2) for n, c in r.capacity.items()},
                "capacity_is_lower_bound": sorted(n for n, c in r.capacity.items() if c.lower_bound_only),
                "capacity_not_searched": [n for n in r.contenders if n not in r.capacity],
                "capacity_search": _searches(r, method.p99_ttft_below),
                "levels": [
                    {
                        "load": level,
                        "contenders": {
                            n: {k: _round(v) for k, v in s.as_dict().items()} for n, s in runs.items()
                        },
                    }
                    for level, runs in r.levels
                ],
            }
            for r in results
        ],
        "targets": [
            {
                "target": c.describe(),
                "variant": c.variant,
                "load": c.level,
                "value": _round(c.value),
                "reference": _round(c.reference),
                "met": c.met,
            }
            for c in checks
        ],
    }


def _round(value: float) -> float:
    if isinstance(value, int) or not math.isfinite(value):
        return value
    return round(value, 4 if abs(value) < 10 else 1)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f}" if seconds < 10 else f"{seconds:,.1f} s"


def plot(scenario: Scenario, result: VariantResult, out: Path) -> list[Path]:
    """p90 TTFT and output tokens/s against load, one line per contender; the PNGs written."""
    import matplotlib  # a slow import, and only the report needs it

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    names = result.contenders
    loads = [level for level, _ in result.levels]
    suffix = f"-{result.variant}" if result.variant else ""
    paths = []
    for key, stem, label, log in (
        ("ttft_p90_s", "ttft-p90", "p90 TTFT (s, log scale)", True),
        ("tokens_per_s", "throughput", "output tokens/s", False),
    ):
        figure, axes = plt.subplots(figsize=(7, 4.2), dpi=110)
        for name in names:
            axes.plot(
                loads,
                [metric(runs[name], key) for _, runs in result.levels],
                marker="o",
                linewidth=2.4 if name.startswith("pointsman-best") else 1.2,
                label=name,
            )
        if log:
            axes.set_yscale("log")
        axes.set_xlabel(f"load (fraction of {scenario.load.reference}'s capacity)")
        axes.set_ylabel(label)
        axes.set_title(f"{scenario.name}{suffix}: {label.split(' (')[0]}")
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=7, ncol=2)
        figure.tight_layout()
        path = out / f"quality-{scenario.name}{suffix}-{stem}.png"
        figure.savefig(path)
        plt.close(figure)
        paths.append(path)
    return paths


def _targets_run(run: Mapping[str, Any] | None) -> list[str]:
    """The paragraph that says a report is a ``--targets`` run, and what it left out."""
    if not run:
        return []

    def names(values: Sequence[Any]) -> str:
        return ", ".join(f"`{v}`" if isinstance(v, str) else f"{v:g}" for v in values) or "none"

    return [
        "**A targets run** (`--targets`): only what the scenario's targets need was run, at the "
        f"scenario's full length. Contenders run: {names(run['contenders'])}; left out: "
        f"{names(run['contenders_left_out'])}. Load levels run: {names(run['levels'])}; left out: "
        f"{names(run['levels_left_out'])}. Capacity searched for {names(run['capacity_searched'])} "
        "only; the other contenders' capacity was not searched.",
        "",
    ]


def markdown(
    scenario: Scenario,
    results: Sequence[VariantResult],
    checks: Sequence[Check],
    plots: Mapping[str, Sequence[Path]],
    info: Mapping[str, Any],
) -> str:
    method = CapacityMethod.of(scenario, info["duration_s"])
    bound = method.p99_ttft_below
    lines = [f"# Routing quality: `{scenario.name}`", ""]
    if scenario.description:
        lines += [scenario.description.strip(), ""]
    lines += [
        f"Virtual time (the simulator's fleet driver, the picker's own Director for Pointsman's contenders); "
        f"{scenario.fleet.pods} pods of `{scenario.fleet.profile}`; {info['duration_s']:g} s of arrivals per "
        f"run, {info.get('repeats', 1)} repeat(s) pooled per figure; seed {scenario.seed}; "
        f"load = a fraction of `{scenario.load.reference}`'s capacity. {info['runs']} runs "
        f"({info.get('level_runs_that_were_probes', 0)} level runs were probes) in {info['wall_s']:.0f} s "
        "of wall time" + (" (QUICK: fewer levels, shorter runs)." if info.get("quick") else "."),
        "",
        *_targets_run(info.get("targets_run")),
        f"How capacity was found: {method.text()}. Each contender's probes are listed beside its "
        "capacity (req/s, ✓ passed, ✗ failed), with any level run whose verdict contradicts it.",
        "",
        PERCENTILE_RULE_TEXT,
        "",
    ]
    if checks:
        met = sum(c.met for c in checks)
        lines += [f"## Targets: {met} of {len(checks)} checks met", ""]
        lines += ["| target | variant | load | value | against | |", "|---|---|---|---|---|---|"]
        for c in checks:
            load = "capacity" if c.level is None else f"{c.level:g}"
            lines.append(
                f"| {c.describe()} | {c.variant or '-'} | {load} | {c.value:.4g} | {c.reference:.4g} | "
                f"{'met' if c.met else '**missed**'} |"
            )
        lines.append("")
    for result in results:
        title = f"variant `{result.variant}`" if result.variant else "results"
        lines += [f"## {title}", ""]
        rr = result.capacity.get("round-robin")
        against = contradictions(result, bound)
        lines += [
            "| contender | capacity (req/s) | x round-robin | probes | level runs against it |",
            "|---|---|---|---|---|",
        ]
        for name, cap in sorted(result.capacity.items(), key=lambda kv: -kv[1].rate):
            times = f"{cap.rate / rr.rate:.1f}" if rr and rr.rate else "-"
            at_least = " (at least)" if cap.lower_bound_only else ""
            probes = " ".join(f"{p.rate:g} {'✓' if passes(p, bound) else '✗'}" for p in cap.probes) or "-"
            contrary = "; ".join(
                f"**load {level:g} ({run.rate:.1f} req/s) {'passed' if passes(run, bound) else 'failed'}**"
                for level, run in against.get(name, [])
            )
            lines.append(f"| {name} | {cap.rate:.1f}{at_least} | {times} | {probes} | {contrary or 'none'} |")
        for name in result.contenders:
            if name not in result.capacity:
                lines.append(f"| {name} | not searched (--targets) | - | - | - |")
        lines.append("")
        for path in plots.get(result.variant, ()):
            lines += [f"![{path.stem}]({path.name})", ""]
        # Prompts that share prefixes: each contender's prefix-cache hit rate, and as a fraction of the
        # bound's when it ran.
        prefixes = scenario.traffic.prompts is not None
        for level, runs in result.levels:
            rate = next(iter(runs.values())).rate if runs else 0.0
            oracle = runs.get(ORACLE)
            head, rule = "", ""
            if prefixes:
                head, rule = " prefix hit rate |", "---|"
                if oracle is not None:
                    head, rule = head + " x oracle-prefix |", rule + "---|"
            lines += [
                f"### load {level:g} ({rate:.1f} req/s)",
                "",
                "| contender | TTFT p50 (ms) | p90 | p99 | TPOT p90 (ms) | e2e p90 (s) | tokens/s | "
                "adapter loads disk/CPU | 429s | finished |" + head,
                "|---|---|---|---|---|---|---|---|---|---|" + rule,
            ]
            for name, s in sorted(runs.items(), key=lambda kv: kv[1].ttft_p90_s):
                hits = ""
                if prefixes:
                    hits = f" {s.prefix_hit_rate:.3f} |"
                    if oracle is not None:
                        hits += f" {_fraction(s.prefix_hit_rate, oracle.prefix_hit_rate)} |"
                lines.append(
                    f"| {name} | {_ms(s.ttft_p50_s)} | {_ms(s.ttft_p90_s)} | {_ms(s.ttft_p99_s)} | "
                    f"{s.tpot_p90_s * 1000:.1f} | {s.e2e_p90_s:.2f} | {s.tokens_per_s:,.0f} | "
                    f"{s.adapter_loads_disk}/{s.adapter_loads_cpu} | {s.rejected} | "
                    f"{s.finished}/{s.requests} |" + hits
                )
            lines.append("")
    return "\n".join(lines)


def write(
    out: Path,
    scenario: Scenario,
    results: Sequence[VariantResult],
    info: Mapping[str, Any],
    *,
    with_plots: bool = True,
) -> list[Check]:
    """Write the report files into ``out``; return the target checks."""
    out.mkdir(parents=True, exist_ok=True)
    checks = [c for target in scenario.targets for r in results for c in check(target, r)]
    plots = {r.variant: plot(scenario, r, out) for r in results} if with_plots else {}
    (out / f"quality-{scenario.name}.md").write_text(markdown(scenario, results, checks, plots, info) + "\n")
    document = full(scenario, results, checks, info)
    (out / f"quality-{scenario.name}.json").write_text(json.dumps(document, indent=1) + "\n")
    # A targets run has some levels and contenders only: not the shape other tools read.
    if scenario.summary_variant is not None and not info.get("targets_run"):
        chosen = [r for r in results if r.variant == scenario.summary_variant]
        if chosen:
            text = json.dumps(summary(scenario, chosen[0]), indent=1) + "\n"
            (out / "quality-summary.json").write_text(text)
    return checks
