"""Flow control under overload, in virtual time: the multi-LoRA mix from two tenants (one sending ten
times more than the other), half Critical and half Sheddable, at fractions of the pool's capacity,
routed by one Pointsman config with and without ``flowControl``.

Per level and contender: Critical p99 TTFT (queue time included), goodput (requests served with TTFT
under the capacity criterion's 2 s, per second, against the capacity), the quiet tenant's p90 TTFT
against what it gets alone (its requests only, the same contender), and what was shed, by objective.
Counted over the requests that arrive after the scenario's ``warmup`` (the cold start: every adapter
loaded from disk at once, the same for every contender, and most of the first seconds' tail); the
same figures with the warm-up counted go beside them (``with_warmup``). The targets of issue #20 are
checked and printed; the numbers go to bench/results/overload.json.

    .venv/bin/python bench/overload.py [--levels 0.5,0.9,1.2,1.5] [--duration 30] [--capacity 480]

``--pickers 2``: two pickers with flow control, each request sent to one at random (their prefix
indexes shared), without and with their dispatches shared (``TwoPickers(share_dispatches=...)``, the
in-process stand-in for :mod:`pointsman_picker.peer_sync`), one picker beside them; besides the
figures above, how far the pods went past the detector's ``maxPodRequests`` (running + waiting, per
pod and snapshot round). The numbers go to bench/results/overload-2-pickers.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from pointsman_quality.contenders import merged, models_for
from pointsman_quality.picker_path import DirectorRouter, TwoPickers
from pointsman_quality.scenario import engine_configs, load_scenario
from pointsman_quality.workload import build_trace
from pointsman_shared.config import PointsmanConfig, parse_config
from pointsman_shared.snapshot import PodSnapshot
from pointsman_shared.stats import percentile
from pointsman_sim.fleet import FleetResult, TraceRequest, run_fleet

REPO = Path(__file__).resolve().parent.parent
SCENARIO = REPO / "bench/overload.yaml"
RESULTS = REPO / "bench/results/overload.json"
RESULTS_2 = REPO / "bench/results/overload-2-pickers.json"
LOUD, QUIET = "loud", "quiet"
OBJECTIVES = [{"name": "critical", "priority": 0}, {"name": "sheddable", "priority": -1}]
SLO_TTFT = 2.0  # the capacity criterion's


def labelled(trace: Sequence[TraceRequest], seed: str) -> list[TraceRequest]:
    """Each request given a tenant (loud ten times as often as quiet) and an objective (half each)."""
    rng = random.Random(seed)
    return [
        dataclasses.replace(
            r,
            tenant=LOUD if rng.random() < 10 / 11 else QUIET,
            objective="critical" if rng.random() < 0.5 else "sheddable",
        )
        for r in trace
    ]


def configs(scenario: Any, flow: dict[str, Any]) -> dict[str, PointsmanConfig]:
    best = yaml.safe_load((REPO / "config/profiles/best.yaml").read_text(encoding="utf-8"))
    base = merged(
        merged({"models": models_for(scenario), "objectives": OBJECTIVES}, scenario.pointsman), best
    )
    return {
        "pointsman-best": parse_config(base, source="pointsman-best"),
        "pointsman-best-flow": parse_config(merged(base, {"flowControl": flow}), source="flow"),
    }


def run(
    config: PointsmanConfig,
    scenario: Any,
    engines: list[Any],
    trace: list[TraceRequest],
    *,
    pickers: int = 1,
    share_dispatches: bool = False,
    rounds: list[Sequence[PodSnapshot]] | None = None,
) -> FleetResult:
    """One run; ``rounds`` collects the pods of every snapshot round the router saw."""
    rng = random.Random(f"{scenario.seed}:router")
    base = scenario.traffic.base_model
    router: DirectorRouter | TwoPickers = (
        DirectorRouter(config, base, rng)
        if pickers == 1
        else TwoPickers(config, base, rng, shared=True, share_dispatches=share_dispatches)
    )

    def dispatch(now: float, pods: Sequence[PodSnapshot]) -> Any:
        if rounds is not None and (not rounds or rounds[-1] is not pods):
            rounds.append(pods)
        return router.dispatch(now, pods)

    return run_fleet(
        engines,
        trace,
        router,
        on_finish=lambda index, served: router.finished(trace[index]),
        dispatch=dispatch,
        on_first_token=lambda index, at: router.first_token(trace[index], at),
    )


def past_threshold(rounds: list[Sequence[PodSnapshot]], limit: int) -> dict[str, float]:
    """How far the pods went past ``limit`` running + waiting requests, over the snapshot rounds: each
    pod, and the pool's mean (what the detector's ``maxPodRequests`` bounds for Sheddable traffic)."""
    excess = [max(p.running + p.waiting - limit, 0) for pods in rounds for p in pods]
    over = [e for e in excess if e]
    means = [sum(p.running + p.waiting for p in pods) / len(pods) - limit for pods in rounds if pods]
    past = sorted(max(m, 0.0) for m in means)
    return {
        "pod_rounds": len(excess),
        "pod_rounds_past_limit_share": len(over) / len(excess) if excess else 0.0,
        "excess_mean": sum(excess) / len(excess) if excess else 0.0,
        "excess_max": max(excess, default=0),
        "excess_p99": percentile(sorted(excess), 0.99) if excess else 0.0,
        "rounds_mean_past_limit_share": sum(1 for m in means if m > 0) / len(means) if means else 0.0,
        "mean_excess_p99": percentile(past, 0.99) if past else 0.0,
        "mean_excess_max": past[-1] if past else 0.0,
    }


def figures(
    trace: list[TraceRequest], result: FleetResult, duration: float, capacity: float, warmup: float = 0.0
) -> dict[str, Any]:
    """The figures of the requests arriving from ``warmup`` on (goodput per second of those arrivals)."""
    ttfts: dict[tuple[str | None, str | None], list[float]] = {}
    for s in result.served:
        r = trace[int(s.request.request_id[1:])]
        if r.arrival >= warmup:
            ttfts.setdefault((r.tenant, r.objective), []).append(s.request.time_to_first_token)
    sent: dict[str | None, int] = {}
    for r in trace:
        if r.arrival >= warmup:
            sent[r.objective] = sent.get(r.objective, 0) + 1
    duration -= warmup

    def of(tenant: str | None = None, objective: str | None = None) -> list[float]:
        return sorted(
            t
            for (te, ob), values in ttfts.items()
            if (tenant is None or te == tenant) and (objective is None or ob == objective)
            for t in values
        )

    served_by = {ob: len(of(objective=ob)) for ob in ("critical", "sheddable")}
    good = sum(1 for t in of() if t <= SLO_TTFT)
    critical, quiet = of(objective="critical"), of(tenant=QUIET)
    return {
        "requests": sum(sent.values()),
        "served": sum(served_by.values()),
        "critical_ttft_p99_s": percentile(critical, 0.99) if critical else None,
        "critical_ttft_p90_s": percentile(critical, 0.9) if critical else None,
        "quiet_ttft_p90_s": percentile(quiet, 0.9) if quiet else None,
        "goodput_rps": good / duration,
        "goodput_x_capacity": good / duration / capacity,
        "unserved_critical": sent.get("critical", 0) - served_by["critical"],
        "unserved_sheddable": sent.get("sheddable", 0) - served_by["sheddable"],
        "ended_at_s": result.ended_at,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="0.5,0.9,1.2,1.5")
    parser.add_argument("--duration", type=float, default=None)
    parser.add_argument("--capacity", type=float, default=None, help="req/s (default: the scenario's)")
    parser.add_argument("--pickers", type=int, choices=(1, 2), default=1)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--dispatch-deadline",
        choices=("on", "off"),
        default="on",
        help="flowControl.dispatchDeadline.enabled (on, the default: a held request its pod would answer"
        " past its time limit is answered as expired; off: sent anyway)",
    )
    args = parser.parse_args()
    if args.pickers == 2:
        two_pickers(args)
        return
    args.out = args.out or RESULTS
    doc, scenario, engines, capacity, duration = _setup(args)
    warmup = float(doc.get("warmup", 0))
    contenders = configs(scenario, doc["flowControl"])
    out: dict[str, Any] = {
        "scenario": doc,
        "capacity_rps": capacity,
        "duration_s": duration,
        "warmup_s": warmup,
        "levels": {},
    }
    for level in (float(x) for x in args.levels.split(",")):
        trace = labelled(build_trace(scenario, capacity * level, duration), f"{scenario.seed}:{level}:labels")
        quiet_alone = [r for r in trace if r.tenant == QUIET]
        row: dict[str, Any] = {}
        for name, config in contenders.items():
            started = time.perf_counter()
            result = run(config, scenario, engines, trace)
            numbers = figures(trace, result, duration, capacity, warmup)
            alone_result = run(config, scenario, engines, quiet_alone)
            alone = figures(quiet_alone, alone_result, duration, capacity, warmup)
            numbers["quiet_alone_ttft_p90_s"] = alone["quiet_ttft_p90_s"]
            cold = figures(trace, result, duration, capacity)
            cold["quiet_alone_ttft_p90_s"] = figures(quiet_alone, alone_result, duration, capacity)[
                "quiet_ttft_p90_s"
            ]
            numbers["with_warmup"] = cold
            numbers["wall_s"] = round(time.perf_counter() - started, 1)
            row[name] = numbers
            print(f"{level:.2f}x {name}: {json.dumps(numbers)}", flush=True)
        out["levels"][f"{level:g}"] = row
    out["targets"] = targets(out["levels"])
    out["targets_with_warmup"] = targets(
        {level: {name: n["with_warmup"] for name, n in row.items()} for level, row in out["levels"].items()}
    )
    for line in out["targets"]:
        print(line)
    args.out.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")


def _setup(args: argparse.Namespace) -> tuple[dict[str, Any], Any, Any, float, float]:
    """bench/overload.yaml, its base scenario, the variant's engines, and the capacity and duration
    (the flags' or the file's)."""
    doc = yaml.safe_load(SCENARIO.read_text(encoding="utf-8"))
    if args.dispatch_deadline == "off":
        doc["flowControl"] = {**doc["flowControl"], "dispatchDeadline": {"enabled": False}}
    scenario = load_scenario(SCENARIO.parent / doc["base"])
    variant = next(v for v in scenario.variants if v.name == doc["variant"])
    engines = engine_configs(scenario, variant)
    capacity = args.capacity or float(doc["capacity"])
    duration = args.duration or float(doc["duration"])
    return doc, scenario, engines, capacity, duration


def two_pickers(args: argparse.Namespace) -> None:
    """One picker with flow control, and two without and with their dispatches shared."""
    doc, scenario, engines, capacity, duration = _setup(args)
    config = configs(scenario, doc["flowControl"])["pointsman-best-flow"]
    limit = doc["flowControl"]["saturationDetector"]["maxPodRequests"]
    contenders = {
        "pointsman-best-flow": (1, False),
        "pointsman-best-flow-2-pickers": (2, False),
        "pointsman-best-flow-2-pickers-shared": (2, True),
    }
    out: dict[str, Any] = {"scenario": doc, "capacity_rps": capacity, "duration_s": duration, "levels": {}}
    for level in (float(x) for x in args.levels.split(",")):
        trace = labelled(build_trace(scenario, capacity * level, duration), f"{scenario.seed}:{level}:labels")
        row: dict[str, Any] = {}
        for name, (pickers, share) in contenders.items():
            started = time.perf_counter()
            rounds: list[Sequence[PodSnapshot]] = []
            result = run(
                config, scenario, engines, trace, pickers=pickers, share_dispatches=share, rounds=rounds
            )
            numbers = figures(trace, result, duration, capacity)
            numbers |= past_threshold(rounds, limit)
            numbers["wall_s"] = round(time.perf_counter() - started, 1)
            row[name] = numbers
            print(f"{level:.2f}x {name}: {json.dumps(numbers)}", flush=True)
        out["levels"][f"{level:g}"] = row
    (args.out or RESULTS_2).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")


def targets(levels: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Issue #20's targets, each met or not, per level."""
    lines = []
    for level, row in levels.items():
        off, on = row["pointsman-best"], row["pointsman-best-flow"]
        x = float(level)
        if x >= 1.2:
            checks = [
                (
                    "critical p99 <= 0.5x without",
                    _ratio(on["critical_ttft_p99_s"], off["critical_ttft_p99_s"]),
                    0.5,
                ),
                ("goodput >= 0.95x capacity", on["goodput_x_capacity"], -0.95),
                (
                    "quiet p90 <= 1.2x alone",
                    _ratio(on["quiet_ttft_p90_s"], on["quiet_alone_ttft_p90_s"]),
                    1.2,
                ),
            ]
            shed_first = on["unserved_critical"] <= on["unserved_sheddable"]
            lines.append(f"{level}x sheddable shed first: {'met' if shed_first else 'MISSED'}")
        else:
            checks = [
                (
                    "critical p99 within 2% of without",
                    _ratio(on["critical_ttft_p99_s"], off["critical_ttft_p99_s"]),
                    1.02,
                ),
                ("goodput within 2% of without", _ratio(off["goodput_rps"], on["goodput_rps"]), 1.02),
            ]
        for what, value, bound in checks:
            ok = value is not None and (value >= -bound if bound < 0 else value <= bound)
            lines.append(
                f"{level}x {what}: {value if value is None else round(value, 3)} {'met' if ok else 'MISSED'}"
            )
    return lines


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


if __name__ == "__main__":
    main()
