"""``bench/results/live-SCENARIO.md``, from the json ``bench/live.py`` writes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pointsman_shared.stats import PERCENTILE_RULE_TEXT


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.0f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _yes(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _runs(result: Mapping[str, Any]) -> Iterable[tuple[float, str, Mapping[str, Any]]]:
    for level in result["levels"]:
        for name, run in level["contenders"].items():
            yield level["level"], name, run


def markdown(result: Mapping[str, Any]) -> str:
    """``bench/results/live-SCENARIO.md`` from the json ``bench/live.py`` writes."""
    setup = result["setup"]
    k = setup["time_scale"]
    lines = [
        f"# Live vs virtual: scenario `{result['scenario']}`"
        + (f" ({result['variant']})" if result["variant"] else ""),
        "",
        f"- Client: **{result['client']}**: {result['client_note']}.",
        f"- Time scale k = {k:g}: the pods run `--speedup {1 / k:g}` (every step and adapter load "
        f"{k:g} times longer) at 1/{k:g} of the arrival rate; the virtual runs use the same "
        f"{k:g}-times-slower engine. {setup['pods']} pods; per run {setup.get('warmup_s', 0):g} s of "
        f"warm-up arrivals (sent, not counted: the cold start, every adapter loaded from disk), then "
        f"{setup['duration_s']:g} s of counted ones.",
        f"- Levels are fractions of `{setup['reference']}`'s capacity, {setup['capacity_rps']:.1f} req/s "
        f"on the unscaled engine ({setup['capacity_source']}): {setup['capacity_rps'] / k:.2f} req/s at "
        f"1/{k:g} of the rate.",
        f"- Virtual: each live run replayed in virtual time with the requests the client sent, median of "
        f"{setup['virtual_seeds']} router seeds.",
        f"- Machine: {result['machine']['note']}",
        f"- {PERCENTILE_RULE_TEXT}",
        "",
        "## Agreement (live / virtual)",
        "",
        f"Required: {setup['required']}.",
        "",
        "| level | contender | own load | virtual as | TTFT p50 ms live / virtual | ratio "
        "| TTFT p90 ms live / virtual | ratio | in seed range p50 / p90 | p99 ratio | TPOT p90 ratio "
        "| e2e p90 ratio | agrees |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level, name, run in _runs(result):
        live, virtual, agree = run.get("live"), run.get("virtual"), run.get("agreement")
        if not live or not virtual or not agree:
            continue
        ratios = agree["ratios"]
        verdict = ("yes" if agree["agrees"] else "**no**") if run["required"] else "(not required)"
        own = run.get("own_load")
        inside = run.get("in_seed_range", {})
        lines.append(
            f"| {level:g} | {name} | {'-' if own is None else f'{own:g}'} | {run['virtual_contender']} "
            f"| {_ms(live['ttft_p50_s'])} / {_ms(virtual['ttft_p50_s'])} | {_ratio(ratios['ttft_p50_s'])} "
            f"| {_ms(live['ttft_p90_s'])} / {_ms(virtual['ttft_p90_s'])} | {_ratio(ratios['ttft_p90_s'])} "
            f"| {_yes(inside.get('ttft_p50_s'))} / {_yes(inside.get('ttft_p90_s'))} "
            f"| {_ratio(ratios['ttft_p99_s'])} | {_ratio(ratios['tpot_p90_s'])} "
            f"| {_ratio(ratios['e2e_p90_s'])} | {verdict} |"
        )
    stale = [(level, name, run) for level, name, run in _runs(result) if run.get("virtual_stale")]
    if stale:
        interval = stale[0][2]["virtual_stale"]["snapshot_interval_s"]
        lines += [
            "",
            f"Sensitivity to the age of the routing data: the same virtual replay with snapshots every "
            f"{interval * 1000:g} ms instead of 50 (the live collector scrapes each pod on its own jittered "
            "50 ms timer and publishes at most twice an interval, so live data is older on average).",
            "",
            f"| level | contender | TTFT p50 ms virtual @{interval * 1000:g} ms | ratio | p90 | ratio |",
            "|---|---|---|---|---|---|",
        ]
        for level, name, run in stale:
            v = run["virtual_stale"]
            lines.append(
                f"| {level:g} | {name} | {_ms(v['ttft_p50_s'])} | {_ratio(v['ratios']['ttft_p50_s'])} "
                f"| {_ms(v['ttft_p90_s'])} | {_ratio(v['ratios']['ttft_p90_s'])} |"
            )
    lines += [
        "",
        "## Live runs",
        "",
        "| level | contender | client | req/s | requests | finished | failed | TTFT p50 ms | p90 | p99 "
        "| TPOT p90 ms | e2e p90 s | output tok/s | cores (ours / machine) | disturbed |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level, name, run in _runs(result):
        live = run.get("live")
        if not live:
            lines.append(f"| {level:g} | {name} | failed: {run.get('error', '?')} |" + " |" * 12)
            continue
        cpu = run.get("cpu", {})
        lines.append(
            f"| {level:g} | {name} | {run.get('client', '-')} | {live['rate']:.2f} | {live['requests']} "
            f"| {live['finished']} | {live['failed']} | {_ms(live['ttft_p50_s'])} "
            f"| {_ms(live['ttft_p90_s'])} | {_ms(live['ttft_p99_s'])} | {_ms(live['tpot_p90_s'])} "
            f"| {live['e2e_p90_s']:.1f} "
            f"| {live['tokens_per_s']:.0f} | {cpu.get('ours_cores', '-')} / {cpu.get('machine_cores', '-')} "
            f"| {'yes' if cpu.get('disturbed') else 'no'} |"
        )
    lines += [
        "",
        "## Virtual runs (the same requests, the same k)",
        "",
        "| level | contender | as | TTFT p50 ms (seed range) | p90 (seed range) | p99 | TPOT p90 ms "
        "| e2e p90 s | output tok/s | adapter loads | max pod share |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level, name, run in _runs(result):
        virtual, spread = run.get("virtual"), run.get("virtual_range", {})
        if not virtual:
            continue
        p50, p90 = spread.get("ttft_p50_s", [None, None]), spread.get("ttft_p90_s", [None, None])
        lines.append(
            f"| {level:g} | {name} | {run['virtual_contender']} "
            f"| {_ms(virtual['ttft_p50_s'])} ({_ms(p50[0])}-{_ms(p50[1])}) "
            f"| {_ms(virtual['ttft_p90_s'])} ({_ms(p90[0])}-{_ms(p90[1])}) | {_ms(virtual['ttft_p99_s'])} "
            f"| {_ms(virtual['tpot_p90_s'])} | {virtual['e2e_p90_s']:.1f} | {virtual['tokens_per_s']:.0f} "
            f"| {virtual['adapter_loads_disk']:.0f} | {virtual['max_pod_share']:.2f} |"
        )
    cached = [(level, name, run) for level, name, run in _runs(result) if run.get("prefix_cache")]
    if cached:
        lines += [
            "",
            "## Prefix cache",
            "",
            "Hit rate: the pods' `vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total` "
            "(tokens), live over the counted arrivals (read when they begin and after the last "
            "response) and with the warm-up; virtual: the same counters of the replay's engines.",
            "",
            "| level | contender | hit rate live | with warm-up | virtual | TTFT p50 / p90 / p99 ms live "
            "| output tok/s live |",
            "|---|---|---|---|---|---|---|",
        ]
        for level, name, run in cached:
            c, live, virtual = run["prefix_cache"], run.get("live") or {}, run.get("virtual") or {}
            lines.append(
                f"| {level:g} | {name} | {_ratio(c.get('hit_rate'))} "
                f"| {_ratio(c.get('hit_rate_with_warmup'))} "
                f"| {_ratio(virtual.get('prefix_hit_rate'))} | {_ms(live.get('ttft_p50_s'))} / "
                f"{_ms(live.get('ttft_p90_s'))} / {_ms(live.get('ttft_p99_s'))} "
                f"| {live.get('tokens_per_s', 0):.0f} |"
            )
    warm = [(level, name, run) for level, name, run in _runs(result) if run.get("with_warmup")]
    if warm:
        lines += [
            "",
            "The same comparison counting the warm-up's requests too (the cold start dominates their "
            "p90: a handful of early routing choices decide which requests wait for an adapter load):",
            "",
            "| level | contender | TTFT p50 ms live / virtual | ratio | TTFT p90 ms live / virtual | ratio "
            "| virtual p90 seed range ms |",
            "|---|---|---|---|---|---|---|",
        ]
        for level, name, run in warm:
            w = run["with_warmup"]
            lo, hi = w["virtual_range"]["ttft_p90_s"]
            lines.append(
                f"| {level:g} | {name} | {_ms(w['live']['ttft_p50_s'])} / {_ms(w['virtual']['ttft_p50_s'])} "
                f"| {_ratio(w['agreement']['ratios']['ttft_p50_s'])} "
                f"| {_ms(w['live']['ttft_p90_s'])} / {_ms(w['virtual']['ttft_p90_s'])} "
                f"| {_ratio(w['agreement']['ratios']['ttft_p90_s'])} | {_ms(lo)}-{_ms(hi)} |"
            )
    notes = result.get("notes") or []
    if notes:
        lines += ["", "## Notes", "", *[f"- {note}" for note in notes]]
    return "\n".join(lines) + "\n"
