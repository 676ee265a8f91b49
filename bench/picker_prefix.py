"""`make bench-picker`'s prefix mode (``bench/picker.py --only-prefix``, and ``detail.prefix`` of every
full run): the picker's CPU per decision with 4 KB prompts, with prefix scoring and without it.

The same picker, Envoy and backend pods as the rest of bench-picker; what changes is the request body
and the picker's profile. The bodies are ``decision_cost.prefix_bodies``: 512 completions of 4 KB, 8
system prompts of 3 KB each followed by a question of its own (chat traffic with system prompts), sent
in turn by wrk's ``request()`` so the prefix index sees prompts it holds and prompts it does not. The
profiles, each on a fresh picker (its index warmed by the run's first second):

- ``default``: the #423 tree (no prefix plugin): the picker's default, for reference;
- ``gie-default-without-prefix``: config/profiles/gie-default.yaml less its prefix-cache-scorer;
- ``gie-default``: that file as it is (queue 2, KV 2, prefix 3, LoRA affinity 1);
- ``best``: config/profiles/best.yaml, the shipped prefix-aware tree (the producer, least-work-prefix,
  prefix affinity).

The pickers read Redis, so each shares its prefix index through the pool's stream as deployed (the
sync's CPU is the picker's). Each profile runs in the setups of :data:`SETUPS` under the closed loop,
``rounds`` times in turn (a shared machine moves between runs); the summary is the upper median.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from decision_cost import prefix_bodies
from picker import (
    HOST,
    PATH,
    REWRITTEN_MODEL,
    SETUPS,
    SHIPPED,
    WRK_DONE,
    Bench,
    Meter,
    Pickers,
    busy_runs,
    calibration_ms,
    python_closed_loop,
    start_envoy,
    wait_completion,
    wrk_figures,
)

from pointsman_shared import aio

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ROOT / "config" / "profiles"
BUDGET_US = 400.0  # issue #19: CPU per decision with a 4 KB prompt
PROMPTS = 512
REQUESTS_ONLY = next(s for s in SETUPS if s.name == "requests_only")
PREFIX_SETUPS = (REQUESTS_ONLY, SHIPPED)
WITH_PREFIX = ("gie-default", "best")
SCORER = "prefix-cache-scorer"


def profiles() -> dict[str, dict[str, Any] | None]:
    """The profiles compared, by name (None: the picker's default profile)."""
    gie = yaml.safe_load((PROFILES / "gie-default.yaml").read_text(encoding="utf-8"))
    without = json.loads(json.dumps(gie))
    without["plugins"] = [p for p in without["plugins"] if p["type"] != SCORER]
    without["profiles"][0]["plugins"] = [
        e for e in without["profiles"][0]["plugins"] if e["pluginRef"] != SCORER
    ]
    best = yaml.safe_load((PROFILES / "best.yaml").read_text(encoding="utf-8"))
    return {"default": None, "gie-default-without-prefix": without, "gie-default": gie, "best": best}


def bodies(count: int = PROMPTS) -> list[bytes]:
    """``prefix_bodies`` for the model the picker rewrites (so every decision also rewrites the body)."""
    out = []
    for body in prefix_bodies(count, random.Random(7)):
        doc = json.loads(body)
        doc["model"] = REWRITTEN_MODEL
        out.append(json.dumps(doc).encode())
    return out


def wrk_script(run_dir: Path, payloads: Sequence[bytes]) -> Path:
    """A wrk script sending ``payloads`` in turn, one a request."""
    path = run_dir / "wrk-prefix.lua"
    listed = ",\n".join(f"[==[{p.decode()}]==]" for p in payloads)
    path.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"local bodies = {{\n{listed}\n}}\nlocal i = 0\n"
        "request = function()\n  i = i % #bodies + 1\n  return wrk.format(nil, nil, nil, bodies[i])\nend\n"
        + WRK_DONE,
        encoding="utf-8",
    )
    return path


def closed_loop(bench: Bench, port: int, payloads: Sequence[bytes], seconds: float) -> dict[str, Any]:
    load = bench.load
    if load.wrk is None:
        return aio.run(python_closed_loop(port, payloads, load.connections, seconds))
    script = bench.run_dir / "wrk-prefix.lua"
    if not script.is_file():
        wrk_script(bench.run_dir, payloads)
    argv = [load.wrk, "-t1", f"-c{load.connections}", f"-d{seconds:g}s", "-s", str(script)]
    argv.append(f"http://{HOST}:{port}{PATH}")
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    figures = wrk_figures(done.stdout)
    if done.returncode != 0 or figures is None:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return figures | {"client": "wrk"}


def measured(bench: Bench, port: int, payloads: Sequence[bytes], meter: Meter) -> dict[str, Any]:
    closed_loop(bench, port, payloads, 1.0)  # warm-up: connections, and the index holds every system prompt
    calibration = calibration_ms()
    with meter.run() as usage:
        result = closed_loop(bench, port, payloads, bench.seconds)
    return result | usage.report(result["requests"]) | {"calibration_ms": calibration}


def prefix_runs(bench: Bench, stack: Pickers, server: str, rounds: int = 3) -> dict[str, Any]:
    """Every profile in every setup, ``rounds`` times in turn; ``detail.prefix`` of picker.json."""
    payloads = bodies()
    chosen = profiles()
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {s.name: [] for s in PREFIX_SETUPS} for name in chosen
    }
    for i in range(rounds):
        for name, profile in chosen.items():
            picker, picker_port = stack.start_picker(f"picker-prefix-{name}-{i}", server, profile=profile)
            try:
                for setup in PREFIX_SETUPS:
                    doc, port = setup.bootstrap([picker_port])
                    proxy = start_envoy(doc, f"envoy-prefix-{name}-{setup.name}-{i}", bench.run_dir)
                    try:
                        wait_completion(proxy, port, payloads[0])
                        pids = {"picker": picker.pid, "envoy": proxy.pid, "backend": bench.backend.pid}
                        meter = Meter({**pids, "collector": stack.collector.pid})
                        runs[name][setup.name].append(measured(bench, port, payloads, meter))
                    finally:
                        proxy.stop(5)
            finally:
                stack.stop_picker(picker)

    def upper_median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    summary: dict[str, Any] = {}
    for name, setups in runs.items():
        summary[name] = {
            setup: {
                "cpu_us_per_decision": upper_median([r["cpu_us_per_request"]["picker"] for r in rs]),
                "max_decisions_per_s": upper_median([float(r["per_s"]) for r in rs]),
                # The Python client's closed loop (wrk missing) times no requests.
                "closed_loop_p50_ms": upper_median([r["p50_ms"] for r in rs if r.get("p50_ms") is not None])
                if any(r.get("p50_ms") is not None for r in rs)
                else None,
                "calibration_ms": upper_median([r["calibration_ms"] for r in rs]),
                "rest_of_machine_cores": upper_median([r["cores"]["rest_of_machine"] for r in rs]),
            }
            for setup, rs in setups.items()
        }
    cost = {name: summary[name][REQUESTS_ONLY.name]["cpu_us_per_decision"] for name in summary}
    return {
        "what": (
            f"picker.server={server}; {PROMPTS} completions of {len(payloads[0])} bytes (8 system prompts "
            "of 3 KB, each with a question of its own; decision_cost.prefix_bodies) sent in turn by wrk, "
            f"per profile on a fresh picker (index shared through Redis as deployed) in the setups "
            f"{', '.join(s.name for s in PREFIX_SETUPS)}; {rounds} rounds in turn, closed loop "
            f"{bench.seconds:g} s; the upper median of the rounds. cpu_us_per_decision = the picker's "
            f"user + system CPU / requests; the budget ({BUDGET_US:g} µs) is for requests_only (one "
            "decision a stream)"
        ),
        "pods": len(stack.ports.pods),
        "prompt_bytes": len(payloads[0]),
        "prompts": PROMPTS,
        "budget_us": BUDGET_US,
        "with_prefix": {name: cost[name] for name in WITH_PREFIX},
        "without_prefix": {name: cost[name] for name in cost if name not in WITH_PREFIX},
        "prefix_adds_us": round(cost["gie-default"] - cost["gie-default-without-prefix"], 1),
        "within_budget": {name: cost[name] <= BUDGET_US for name in cost},
        "summary": summary,
        "runs": runs,
        "busy_runs": busy_runs({n: {s: dict(enumerate(rs)) for s, rs in v.items()} for n, v in runs.items()}),
    }


def prefix_markdown(prefix: dict[str, Any]) -> list[str]:
    """picker.md's lines for ``detail.prefix``."""
    setups = [s.name for s in PREFIX_SETUPS]
    lines = [
        "",
        f"4 KB prompts ({prefix['prompt_bytes']} bytes, {prefix['prompts']} prompts in turn, "
        f"{prefix['pods']} pods), picker CPU per decision by profile; budget {prefix['budget_us']:g} µs "
        "(requests_only):",
        "",
        "| profile | prefix scoring | " + " | ".join(f"{s}: CPU per decision; req/s" for s in setups) + " |",
        "|---|---|" + "---|" * len(setups),
    ]
    scored = set(prefix.get("with_prefix", WITH_PREFIX))  # a file's own names (older runs: best-prefix)
    for name, by_setup in prefix["summary"].items():
        cells = [
            f"{by_setup[s]['cpu_us_per_decision']:.0f} µs; {by_setup[s]['max_decisions_per_s']:.0f}"
            for s in setups
        ]
        lines.append(f"| {name} | {'yes' if name in scored else 'no'} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Prefix scoring adds {prefix['prefix_adds_us']} µs per decision (gie-default with and without).",
    ]
    return lines
