"""``pointsman-quality``: run scenario files, write the reports (``make bench-quality``)."""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from pointsman_quality import report
from pointsman_quality.contenders import KNOWN, NAMES, contenders
from pointsman_quality.scenario import Scenario, ScenarioError, Target, engine_configs, load_scenario
from pointsman_quality.sweep import Sweep, VariantResult
from pointsman_shared import cli

log = logging.getLogger("pointsman_quality")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="pointsman-quality",
        description="Route a scenario's traffic through Pointsman's decision path and the routers users "
        "deploy instead, on the simulator's fleet in virtual time; write Markdown, JSON and PNG reports.",
    )
    parser.add_argument("scenarios", nargs="*", type=Path, help="scenario files (bench/scenarios/*.yaml)")
    parser.add_argument(
        "--quick", action="store_true", help="the scenario's quick section: fewer levels, shorter runs"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="report folder (default bench/results, or bench/results/quick with --quick)",
    )
    parser.add_argument(
        "--profiles-dir",
        type=Path,
        default=Path("config/profiles"),
        help="where the documented contender configs are (default config/profiles)",
    )
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="runs in parallel (default: one per core)"
    )
    parser.add_argument(
        "--targets",
        action="store_true",
        help="only what the scenario's targets need, at full length: the contenders they name and the "
        "load reference (every contender for a `best` or `than: others` target), the levels inside "
        "their ranges, the capacity search for the reference (and capacity targets' contenders) alone",
    )
    parser.add_argument("--contenders", help="comma-separated names, instead of the scenario's")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument(
        "--list-contenders", action="store_true", help="print the built-in contenders and exit"
    )
    cli.add_common_flags(parser, distribution="pointsman-quality", log_level="info")
    return parser.parse_args(argv)


class Plan(NamedTuple):
    scenario: Scenario  # as this invocation runs it
    levels: tuple[float, ...]
    duration: float
    searched: tuple[str, ...] | None = None  # whose capacity is searched (None: every contender's)
    targets_run: dict[str, Any] | None = None  # what a --targets run ran and left out, for the report


def plan(scenario: Scenario, args: argparse.Namespace) -> Plan:
    """The scenario as this invocation runs it, its load levels and run duration."""
    names = scenario.contenders
    if args.contenders:
        names = tuple(n.strip() for n in args.contenders.split(",") if n.strip())
    elif args.quick and scenario.quick.contenders is not None:
        names = scenario.quick.contenders
    if args.quick:
        load = scenario.load.model_copy(update={"repeats": scenario.quick.repeats})
        update = {"contenders": names, "variants": scenario.variants[:1], "load": load}
        chosen = Plan(scenario.model_copy(update=update), scenario.quick.levels, scenario.quick.duration)
    else:
        update = {"contenders": names}
        chosen = Plan(scenario.model_copy(update=update), scenario.load.levels, scenario.load.duration)
    return for_targets(chosen) if args.targets else chosen


def for_targets(chosen: Plan) -> Plan:
    """The plan cut to what the scenario's targets need: the contenders they name and the load
    reference (all of them for a target against the best or the others), the levels inside their
    ranges, and the capacity search for the reference and the contenders of capacity targets."""
    scenario, targets = chosen.scenario, chosen.scenario.targets
    reference = scenario.load.reference
    builtin = NAMES if scenario.contenders is None else scenario.contenders
    names = (*builtin, *(extra.name for extra in scenario.extra_contenders))

    def named(of: Sequence[Target]) -> set[str]:
        if any(t.best is not None or t.than == report.OTHERS for t in of):
            return set(names)
        return {reference} | {n for t in of for n in (t.contender, t.than) if n is not None}

    needed = named(targets)
    searched = named([t for t in targets if t.metric == "capacity"]) & needed
    levels = tuple(level for level in chosen.levels if any(t.covers(level) for t in targets))
    update = {
        "contenders": tuple(n for n in builtin if n in needed),
        "extra_contenders": tuple(e for e in scenario.extra_contenders if e.name in needed),
    }
    return Plan(
        scenario.model_copy(update=update),
        levels,
        chosen.duration,
        tuple(n for n in names if n in searched),
        {
            "contenders": [n for n in names if n in needed],
            "contenders_left_out": [n for n in names if n not in needed],
            "levels": list(levels),
            "levels_left_out": [level for level in chosen.levels if level not in levels],
            "capacity_searched": [n for n in names if n in searched],
        },
    )


def run_scenario(path: Path, args: argparse.Namespace, executor: ProcessPoolExecutor) -> list[report.Check]:
    scenario, levels, duration, searched, targets_run = plan(load_scenario(path), args)
    built = contenders(scenario, args.profiles_dir, path.parent)
    names = {c.name for c in built}
    problems = [
        (f"targets[{i}].{key}", f"{name!r} is not a contender of this run")
        for i, t in enumerate(scenario.targets)
        for key, name in (("contender", t.contender), ("than", t.than))
        if name is not None and name != report.OTHERS and name not in names
    ]
    if scenario.load.reference not in names:
        problems.append(("load.reference", f"{scenario.load.reference!r} is not a contender of this run"))
    if problems and not args.contenders:
        raise ScenarioError(str(path), problems)
    if problems:  # a hand-picked subset: targets naming others are skipped
        scenario = scenario.model_copy(
            update={
                "targets": tuple(
                    t
                    for t in scenario.targets
                    if {t.contender, t.than or t.contender} - {report.OTHERS} <= names
                )
            }
        )
        if scenario.load.reference not in names:
            raise ScenarioError(str(path), [p for p in problems if p[0] == "load.reference"])
    started = time.monotonic()
    sweep = Sweep(scenario, built, executor, levels=levels, duration=duration, searched=searched)
    results: list[VariantResult] = []
    for variant in scenario.variants or (None,):
        log.info("%s%s: %d contenders", scenario.name, f" / {variant.name}" if variant else "", len(built))
        results.append(sweep.variant(engine_configs(scenario, variant), variant))
    info = {
        "quick": args.quick,
        "targets_run": targets_run,
        "duration_s": duration,
        "repeats": scenario.load.repeats,
        "runs": sweep.runs,
        "level_runs_that_were_probes": sweep.reused,
        "wall_s": round(time.monotonic() - started, 1),
        "python": platform.python_version(),
    }
    out = args.out or (Path("bench/results/quick") if args.quick else Path("bench/results"))
    checks = report.write(out, scenario, results, info, with_plots=not args.no_plots)
    met = sum(c.met for c in checks)
    log.info(
        "%s: %s; report %s",
        scenario.name,
        f"{met}/{len(checks)} target checks met" if checks else "no targets",
        out / f"quality-{scenario.name}.md",
    )
    for c in checks:
        if not c.met:
            log.warning(
                "missed: %s (%s, load %s): %.4g against %.4g",
                c.describe(),
                c.variant or "-",
                c.level,
                c.value,
                c.reference,
            )
    return checks


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    if args.list_contenders:
        print("\n".join(KNOWN))
        return 0
    if not args.scenarios:
        print("pointsman-quality: give at least one scenario file", file=sys.stderr)
        return 2
    try:
        with ProcessPoolExecutor(max(1, args.jobs)) as executor:
            for path in args.scenarios:
                run_scenario(path, args, executor)
    except ScenarioError as exc:
        print(f"pointsman-quality: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
