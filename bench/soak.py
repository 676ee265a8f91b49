"""`make soak`: the real local stack at 80% of one picker's measured capacity, for 10 minutes.

What it checks (issue 13, "Load"): no errors; the resident memory of every service (Redis, the simulator
pods, the collector, the picker, Envoy) within 10% of its level after the warm-up; no growth in the
open asyncio tasks, ext_proc streams or connections. Steps:

1. Start the stack as `make run` does (``config/local.yaml``, one process serving the simulator pods,
   a collector, a picker, Envoy), on free ports, with a Redis of its own.
2. Measure the capacity: the highest rate of an open-loop ramp through Envoy (6 s steps from 100 req/s,
   each 1.2 times the last) with no error and a p99 within 100 ms, a failed step tried once more; every
   process's CPU over the ramp, and a closed loop's throughput beside it (``wrk -t1 -c16``, or the
   Python client when wrk is missing). ``--rate`` gives the rate instead.
3. Drive ``--fraction`` (0.8) of it, open loop (a request every 1/rate s on a free keep-alive
   connection, a new one when none is free, so a slow answer never holds the sending back), for
   ``--minutes``, the bodies taking turns: the base model, an adapter split four ways, an adapter.
4. Every ``--every`` (10) seconds: each service's RSS, CPU, open files and TCP connections (psutil);
   the picker's open ext_proc streams and event-loop tasks and the collector's tasks (their
   ``/metrics``); Envoy's active connections and requests (its admin stats); the client's answers by
   status, latency and how late it sent; the machine's load average and the busy cores none of the
   stack's processes (nor this one) explain, to tell a run disturbed by others' work.

Writes bench/results/soak.json (every sample) and bench/results/soak.md (a table and the verdict).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parent))
from picker import (
    WRK_DONE,
    Connection,
    calibration_ms,
    cpu_seconds,
    http_request,
    machine_busy_seconds,
    python_closed_loop,
    wrk_figures,
)

from pointsman_devstack import envoy
from pointsman_devstack.stack import LOOPBACK, SimOptions, Stack, StackOptions, StackPorts
from pointsman_shared import aio
from pointsman_shared.config import load_config
from pointsman_shared.stats import PERCENTILE_RULE, PERCENTILE_RULE_TEXT, mean, percentile

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config" / "local.yaml"
RESULTS = ROOT / "bench" / "results"
PATH = "/v1/completions"
BODIES = tuple(
    json.dumps({"model": model, "prompt": "Summarize: points.", "max_tokens": 2}).encode()
    for model in ("meta-llama/Llama-3.1-8B-Instruct", "tweet-summary", "sql-lora")
)
SERVICES = ("redis", "sim", "collector", "picker", "envoy")
REQUEST_TIMEOUT = 30.0  # an answer later than this counts as an error ("timeout")
RSS_BAND = 0.10  # RSS within 10% of its level after the warm-up
# A count "grows" when its least-squares line rises over the measured span by more than the largest of
# GROWTH_FLOOR, GROWTH_SHARE of its mean and GROWTH_NOISE standard errors of that rise: a leak of one per
# thousand requests adds hundreds over ten minutes along a straight line, while an instantaneous count
# that swings with latency (open streams: 2-35 at 850 req/s) fits a line whose rise is noise.
GROWTH_FLOOR = 2.0
GROWTH_SHARE = 0.2
GROWTH_NOISE = 3.0
BUSY_CORES = 0.25  # a window where others used more than this was disturbed
# A request the client itself could not send within this long of its time is skipped, not sent late:
# after a stall of the whole machine (others' memory pressure froze every process for minutes once) a
# backlog sent at once would measure the burst, not the rate.
MAX_LATE = 1.0


# -- load -----------------------------------------------------------------------------------------
def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


@dataclass
class Window:
    """The client's answers since the last sample."""

    began: float = field(default_factory=time.perf_counter)
    statuses: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    max_in_flight: int = 0
    skipped: int = 0  # due more than MAX_LATE ago when the client got to them

    def report(self, in_flight: int, connections: int) -> dict[str, Any]:
        seconds = time.perf_counter() - self.began
        answered = sum(self.statuses.values())
        return {
            "seconds": round(seconds, 2),
            "answered": answered,
            "per_s": round(answered / seconds, 1) if seconds > 0 else 0.0,
            "statuses": dict(sorted(self.statuses.items())),
            "errors": answered - self.statuses.get("200", 0),
            "p50_ms": _ms(percentile(self.latencies, 0.5)) if self.latencies else None,
            "p99_ms": _ms(percentile(self.latencies, 0.99)) if self.latencies else None,
            "max_ms": _ms(max(self.latencies)) if self.latencies else None,
            "send_lag_p99_ms": _ms(percentile(self.lags, 0.99)) if self.lags else None,
            "skipped": self.skipped,
            "in_flight": in_flight,
            "max_in_flight": self.max_in_flight,
            "client_connections": connections,
        }


class OpenLoop:
    """Requests at a fixed rate through the gateway: request i is due at start + i / rate and goes out
    then on a free keep-alive connection (a new one when none is free)."""

    def __init__(self, port: int, rate: float) -> None:
        self._port = port
        self._rate = rate
        self._requests = itertools.cycle([http_request(port, body) for body in BODIES])
        self._free: list[Connection] = []
        self._open: set[Connection] = set()
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.window = Window()
        self.total: Counter[str] = Counter()
        self.skipped = 0

    def take(self) -> dict[str, Any]:
        """The window's report; a new window starts."""
        self._open = {c for c in self._open if not c.closed}
        report = self.window.report(self._in_flight, len(self._open))
        self.window = Window()
        return report

    async def run(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        start = time.perf_counter() + 0.05
        total = int(self._rate * seconds)
        i = 0
        while i < total:
            now = time.perf_counter()
            while i < total and start + i / self._rate <= now:  # timers are ms-coarse: all that is due
                due = start + i / self._rate
                i += 1
                if now - due > MAX_LATE:
                    self.window.skipped += 1
                    self.skipped += 1
                    continue
                task = loop.create_task(self._one(due, next(self._requests)))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            if i < total:
                await asyncio.sleep(max(0.0, start + i / self._rate - time.perf_counter()))
        await asyncio.gather(*self._tasks)
        for conn in self._open:
            if conn.transport is not None:
                conn.transport.close()

    async def _one(self, due: float, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        sent = time.perf_counter()
        window = self.window
        window.lags.append(sent - due)
        self._in_flight += 1
        window.max_in_flight = max(window.max_in_flight, self._in_flight)
        conn: Connection | None = None
        try:
            conn = self._free.pop() if self._free else None
            if conn is None:
                _, conn = await loop.create_connection(Connection, LOOPBACK, self._port)
                self._open.add(conn)
            async with asyncio.timeout(REQUEST_TIMEOUT):
                code = await conn.send(request)
            status = str(code) if code else "broken"
        except TimeoutError:
            status = "timeout"
        except OSError:
            status = "connect"
        finally:
            self._in_flight -= 1
        if status == "200":
            self.window.latencies.append(time.perf_counter() - sent)
        self.window.statuses[status] += 1
        self.total[status] += 1
        if conn is not None:
            if status == "200" and not conn.closed:
                self._free.append(conn)
            elif conn.transport is not None:
                conn.transport.close()


_WRK_SCRIPT = """local bodies = {%s}
local i = 0
request = function()
  i = i %% #bodies + 1
  return wrk.format("POST", "%s", {["Content-Type"] = "application/json"}, bodies[i])
end
"""


def wrk_closed_loop(port: int, seconds: float, connections: int, run_dir: Path) -> dict[str, Any]:
    """``wrk -t1 -c<connections>`` for ``seconds``: requests per second and errors."""
    wrk = shutil.which("wrk")
    assert wrk is not None
    script = run_dir / "soak.lua"
    script.write_text(_WRK_SCRIPT % (", ".join(f"[==[{b.decode()}]==]" for b in BODIES), PATH) + WRK_DONE)
    argv = [wrk, "-t1", f"-c{connections}", f"-d{seconds:g}s", "-s", str(script)]
    argv.append(f"http://{LOOPBACK}:{port}{PATH}")
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    figures = wrk_figures(done.stdout)
    if done.returncode != 0 or figures is None:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return {"client": f"wrk -t1 -c{connections}", **figures}


# -- sampling -------------------------------------------------------------------------------------
@dataclass
class Services:
    """The stack's processes and where to read them."""

    pids: dict[str, int]
    picker_metrics: str
    collector_metrics: str
    envoy_stats: str
    picker_port: int

    @classmethod
    def of(cls, stack: Stack) -> Services:
        assert stack.redis is not None
        assert stack.redis.pid is not None, "the soak needs a local redis-server"
        pids = {"redis": stack.redis.pid} | {name: stack.process(name).pid for name in SERVICES[1:]}
        return cls(
            pids=pids,
            picker_metrics=f"http://{LOOPBACK}:{stack.ports.picker_metrics}/metrics",
            collector_metrics=f"{stack.collector_url}/metrics",
            envoy_stats=f"{stack.admin_url}/stats?format=json&filter=(cx_active|rq_active)$",
            picker_port=stack.ports.picker,
        )


def metric_values(text: str, *names: str) -> dict[str, float]:
    """The sum over label sets of each family in ``names`` (absent: missing)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in names:
            out[family.name] = sum(s.value for s in family.samples if s.name == family.name)
    return out


def process_figures(pid: int, *, port: int | None = None) -> dict[str, Any]:
    process = psutil.Process(pid)
    with process.oneshot():
        sockets = process.net_connections(kind="tcp")
        established = [c for c in sockets if c.status == psutil.CONN_ESTABLISHED]
        out: dict[str, Any] = {
            "rss_mb": round(process.memory_info().rss / 2**20, 2),
            "fds": process.num_fds(),
            "threads": process.num_threads(),
            "tcp": len(established),
        }
    if port is not None:  # the connections made to this port (Envoy's to the picker's ext_proc port)
        out["tcp_on_port"] = sum(1 for c in established if c.laddr and c.laddr.port == port)
    return out


class Sampler:
    def __init__(self, services: Services) -> None:
        self.services = services
        # A new connection per sample: the collector's uvicorn closes a connection idle for 5 s, the
        # sampling interval, so a kept one can close just as the next sample is sent on it.
        self._http = httpx.Client(timeout=5.0, limits=httpx.Limits(max_keepalive_connections=0))
        self._cpu = {name: cpu_seconds(pid) for name, pid in self._all_pids().items()}
        self._machine = machine_busy_seconds()
        self._wall = time.perf_counter()

    def _all_pids(self) -> dict[str, int]:
        return self.services.pids | {"soak_client": os.getpid()}

    def close(self) -> None:
        self._http.close()

    def sample(self) -> dict[str, Any]:
        """Every figure of one sample (blocking: run it in a thread)."""
        s = self.services
        wall = time.perf_counter()
        cpu = {name: cpu_seconds(pid) for name, pid in self._all_pids().items()}
        machine = machine_busy_seconds()
        span = max(wall - self._wall, 1e-9)
        cores = {name: round((cpu[name] - self._cpu[name]) / span, 3) for name in cpu}
        rest = (machine - self._machine) / span - sum(cores.values())
        self._cpu, self._machine, self._wall = cpu, machine, wall
        processes = {
            name: process_figures(pid, port=s.picker_port if name == "picker" else None)
            for name, pid in s.pids.items()
        }
        picker = metric_values(
            self._http.get(s.picker_metrics).text,
            "pointsman_picker_open_streams",
            "pointsman_picker_event_loop_tasks",
            "inference_objective_running_requests",
            "pointsman_picker_snapshot_age_seconds",
            "inference_model_request_error",
        )
        collector = metric_values(
            self._http.get(s.collector_metrics).text,
            "pointsman_collector_event_loop_tasks",
            "pointsman_collector_scrape_errors",
            "pointsman_collector_publish_errors",
        )
        stats = {
            entry["name"]: entry.get("value", 0)
            for entry in self._http.get(s.envoy_stats).json().get("stats", [])
            if "name" in entry
        }
        return {
            "processes": processes,
            "cores": cores,
            "rest_of_machine_cores": round(rest, 3),
            "loadavg": [round(x, 2) for x in os.getloadavg()],
            "picker": {
                "open_streams": picker.get("pointsman_picker_open_streams"),
                "event_loop_tasks": picker.get("pointsman_picker_event_loop_tasks"),
                "running_requests": picker.get("inference_objective_running_requests"),
                "snapshot_age_s": picker.get("pointsman_picker_snapshot_age_seconds"),
                "request_errors_total": picker.get("inference_model_request_error"),
                "ext_proc_connections": processes["picker"]["tcp_on_port"],
            },
            "collector": {
                "event_loop_tasks": collector.get("pointsman_collector_event_loop_tasks"),
                "scrape_errors_total": collector.get("pointsman_collector_scrape_errors"),
                "publish_errors_total": collector.get("pointsman_collector_publish_errors"),
            },
            "envoy": {
                "downstream_cx_active": stats.get("http.gateway.downstream_cx_active"),
                "downstream_rq_active": stats.get("http.gateway.downstream_rq_active"),
                "picker_cx_active": stats.get(f"cluster.{envoy.PICKER_CLUSTER}.upstream_cx_active"),
                "picker_rq_active": stats.get(f"cluster.{envoy.PICKER_CLUSTER}.upstream_rq_active"),
                "pods_cx_active": stats.get(f"cluster.{envoy.POD_CLUSTER}.upstream_cx_active"),
                "pods_rq_active": stats.get(f"cluster.{envoy.POD_CLUSTER}.upstream_rq_active"),
            },
        }


async def soak(services: Services, port: int, rate: float, seconds: float, every: float) -> dict[str, Any]:
    """Drive ``rate`` for ``seconds``, sampling every ``every`` seconds; the samples and the totals."""
    load = OpenLoop(port, rate)
    sampler = Sampler(services)
    samples: list[dict[str, Any]] = []
    began = time.perf_counter()
    driving = asyncio.create_task(load.run(seconds))
    try:
        while not driving.done():
            await asyncio.wait(
                [driving], timeout=max(0.0, began + every * (len(samples) + 1) - time.perf_counter())
            )
            figures = await asyncio.to_thread(sampler.sample)
            sample = {"t": round(time.perf_counter() - began, 1), "client": load.take(), **figures}
            samples.append(sample)
            print(_progress(sample), flush=True)
        await driving
    finally:
        sampler.close()
    return {"samples": samples, "statuses": dict(sorted(load.total.items())), "skipped": load.skipped}


def _progress(sample: dict[str, Any]) -> str:
    c, p, rss = sample["client"], sample["picker"], sample["processes"]
    memory = " ".join(f"{name} {rss[name]['rss_mb']:.0f}" for name in SERVICES)
    return (
        f"t={sample['t']:6.0f}s {c['per_s']:6.1f} req/s errors {c['errors']} p99 {c['p99_ms']} ms | "
        f"RSS MB {memory} | picker streams {p['open_streams']:.0f} tasks {p['event_loop_tasks']:.0f} "
        f"conns {p['ext_proc_connections']} | load {sample['loadavg'][0]}"
    )


# -- the verdict ----------------------------------------------------------------------------------
def trend(values: list[float], times: list[float]) -> dict[str, float]:
    """The least-squares line's rise over the span and its standard error, and the means of the first
    and last thirds."""
    n = len(values)
    mean_t, mean_v = mean(times), mean(values)
    var = sum((t - mean_t) ** 2 for t in times)
    slope = sum((t - mean_t) * (v - mean_v) for t, v in zip(times, values, strict=True)) / var if var else 0.0
    residuals = [v - mean_v - slope * (t - mean_t) for t, v in zip(times, values, strict=True)]
    slope_se = (sum(r * r for r in residuals) / (n - 2) / var) ** 0.5 if var and n > 2 else 0.0
    span = times[-1] - times[0]
    third = max(1, n // 3)
    return {
        "mean": round(mean_v, 2),
        "min": min(values),
        "max": max(values),
        "rise": round(slope * span, 2),
        "rise_se": round(slope_se * span, 2),
        "first_third_mean": round(mean(values[:third]), 2),
        "last_third_mean": round(mean(values[-third:]), 2),
    }


COUNTS = {
    "picker open ext_proc streams": lambda s: s["picker"]["open_streams"],
    "picker event-loop tasks": lambda s: s["picker"]["event_loop_tasks"],
    "picker ext_proc connections (from Envoy)": lambda s: s["picker"]["ext_proc_connections"],
    "picker TCP connections": lambda s: s["processes"]["picker"]["tcp"],
    "picker open files": lambda s: s["processes"]["picker"]["fds"],
    "collector event-loop tasks": lambda s: s["collector"]["event_loop_tasks"],
    "collector TCP connections": lambda s: s["processes"]["collector"]["tcp"],
    "Envoy connections to the picker": lambda s: s["envoy"]["picker_cx_active"],
    "Envoy streams to the picker": lambda s: s["envoy"]["picker_rq_active"],
    "Envoy connections to the pods": lambda s: s["envoy"]["pods_cx_active"],
    "redis TCP connections": lambda s: s["processes"]["redis"]["tcp"],
}


def verdict(
    samples: list[dict[str, Any]], warmup: float, statuses: dict[str, int], skipped: int
) -> dict[str, Any]:
    measured = [s for s in samples if s["t"] >= warmup]
    if len(measured) < 3:
        raise RuntimeError(f"only {len(measured)} samples after the {warmup:.0f} s warm-up")
    times = [s["t"] for s in measured]
    rss: dict[str, Any] = {}
    for name in SERVICES:
        values = [s["processes"][name]["rss_mb"] for s in measured]
        level = values[0]
        worst = max(values, key=lambda v: abs(v - level))
        rss[name] = {
            "after_warmup_mb": level,
            "min_mb": min(values),
            "max_mb": max(values),
            "end_mb": values[-1],
            "worst_change": round((worst - level) / level, 4),
            "flat": all(abs(v - level) <= RSS_BAND * level for v in values),
        }
    counts: dict[str, Any] = {}
    for name, read in COUNTS.items():
        values = [float(read(s) or 0) for s in measured]
        figures = trend(values, times)
        allowed = max(GROWTH_FLOOR, GROWTH_SHARE * figures["mean"], GROWTH_NOISE * figures["rise_se"])
        counts[name] = figures | {"allowed_rise": round(allowed, 2), "flat": figures["rise"] <= allowed}
    answered = sum(statuses.values())
    errors = answered - statuses.get("200", 0)
    disturbed = [
        {"t": s["t"], "rest_of_machine_cores": s["rest_of_machine_cores"], "loadavg_1m": s["loadavg"][0]}
        for s in samples
        if s["rest_of_machine_cores"] > BUSY_CORES
    ]
    first_error = next((s for s in samples if s["client"]["errors"]), None)
    return {
        "rss_flat_within_10pct": all(r["flat"] for r in rss.values()),
        "no_growth_in_tasks_streams_connections": all(c["flat"] for c in counts.values()),
        "no_errors": errors == 0,
        "passed": all(r["flat"] for r in rss.values())
        and all(c["flat"] for c in counts.values())
        and not errors,
        "errors": errors,
        "answered": answered,
        "statuses": statuses,
        "skipped_by_the_client": skipped,
        "rss": rss,
        "counts": counts,
        "first_error": None
        if first_error is None
        else {
            "t": first_error["t"],
            "rest_of_machine_cores": first_error["rest_of_machine_cores"],
            "p99_ms": first_error["client"]["p99_ms"],
        },
        "disturbed_windows": disturbed,
        "samples_measured": len(measured),
    }


# -- the report -----------------------------------------------------------------------------------
def markdown(result: dict[str, Any]) -> str:
    v, cap, machine = result["verdict"], result["capacity"], result["machine"]
    mark = {True: "yes", False: "**no**"}
    share = f"{result['fraction']:.0%} of " if result["fraction"] is not None else "given; "
    rss = "; ".join(
        f"{name} {r['after_warmup_mb']:.1f} MB -> {r['end_mb']:.1f} (worst {r['worst_change']:+.1%})"
        for name, r in v["rss"].items()
    )
    counts = "; ".join(
        f"{name} {c['first_third_mean']:g} -> {c['last_third_mean']:g} (fit rise {c['rise']:+g}, "
        f"allowed {c['allowed_rise']:g})"
        for name, c in v["counts"].items()
    )
    lines = [
        "# Soak: the local stack at 80% of one picker's capacity",
        "",
        f"Run {result['started']} on {machine['cpus']} shared vCPUs ({machine['platform']}), "
        f"`{result['command']}` (`make soak`), commit {result['code']['commit']}. "
        + (f"{result['note']} " if result["note"] else "")
        + f"{result['minutes']:g} minutes at {result['rate']:.0f} req/s "
        f"({share}{cap['per_s']} req/s measured by {cap['client']} through Envoy, {cap['errors']} errors; "
        f"{cap['limit']}), open loop, bodies taking turns (base model, tweet-summary's four adapters, "
        f"sql-lora); a sample every {result['every']:g} s, the first {result['warmup']:g} s warm-up.",
        "",
        "## Verdict",
        "",
        "| criterion | met | figures |",
        "|---|---|---|",
        f"| no errors | {mark[v['no_errors']]} | {v['errors']} of {v['answered']} answers not 200 "
        f"(statuses {v['statuses']}; {v['skipped_by_the_client']} requests skipped, the client more than "
        f"{MAX_LATE:g} s late) |",
        f"| RSS of every service within 10% of its level after warm-up | {mark[v['rss_flat_within_10pct']]} "
        f"| {rss} |",
        f"| no growth in tasks, streams, connections | {mark[v['no_growth_in_tasks_streams_connections']]} "
        f"| {counts} |",
        "",
    ]
    disturbed, (low, high) = v["disturbed_windows"], result["loadavg_range"]
    if disturbed:
        others = [w["rest_of_machine_cores"] for w in disturbed]
        span = f"t = {disturbed[0]['t']:.0f} s to {disturbed[-1]['t']:.0f} s"
        lines.append(
            f"Disturbance: {len(disturbed)} of {len(result['samples'])} windows ({span}) had others using "
            f"more than {BUSY_CORES} core, {min(others):.2f}-{max(others):.2f} (busy cores that neither the "
            f"stack's processes nor the client explain); load average (1 min) {low}-{high}."
        )
    else:
        lines.append(
            f"Disturbance: none seen (others never above {BUSY_CORES} core in a window); load average "
            f"(1 min) {low}-{high}."
        )
    first = v.get("first_error")
    if first is not None:
        lines.append(
            f"The first error came in the window ending at t = {first['t']:.0f} s, p99 {first['p99_ms']} ms, "
            f"others using {first['rest_of_machine_cores']:.2f} core then."
        )
    lines += [
        "",
        "## Over time (every minute)",
        "",
        "| t (s) | req/s | errors | p50 / p99 ms | RSS MB: redis / sim / collector / picker / envoy "
        "| picker streams / tasks / conns | collector tasks / conns | Envoy to picker cx / rq "
        "| cores: picker / envoy / sim / others | load 1m |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    per_minute = max(1, round(60 / result["every"]))
    chosen = [s for i, s in enumerate(result["samples"]) if i % per_minute == per_minute - 1 or i == 0]
    if chosen[-1] is not result["samples"][-1]:
        chosen.append(result["samples"][-1])
    for s in chosen:
        c, p, r, e, k = s["client"], s["picker"], s["processes"], s["envoy"], s["cores"]
        memory = " / ".join(f"{r[name]['rss_mb']:.1f}" for name in SERVICES)
        lines.append(
            f"| {s['t']:.0f} | {c['per_s']:.0f} | {c['errors']} | {c['p50_ms']} / {c['p99_ms']} | {memory} "
            f"| {p['open_streams']:.0f} / {p['event_loop_tasks']:.0f} / {p['ext_proc_connections']} "
            f"| {s['collector']['event_loop_tasks']:.0f} / {r['collector']['tcp']} "
            f"| {e['picker_cx_active']} / {e['picker_rq_active']} "
            f"| {k['picker']:.2f} / {k['envoy']:.2f} / {k['sim']:.2f} / {s['rest_of_machine_cores']:.2f} "
            f"| {s['loadavg'][0]} |"
        )
    lines += [
        "",
        "How: RSS, open files and TCP connections (ESTABLISHED) per process from psutil; the picker's "
        "`pointsman_picker_open_streams` and `..._event_loop_tasks` and the collector's "
        "`pointsman_collector_event_loop_tasks` from their `/metrics`; Envoy's `upstream_cx_active` / "
        "`upstream_rq_active` of the picker cluster from its admin stats. A count passes when the "
        f"least-squares line over the measured samples rises by at most max({GROWTH_FLOOR:g}, "
        f"{GROWTH_SHARE:.0%} of its mean, {GROWTH_NOISE:g} standard errors of the rise); RSS when every "
        f"measured sample is within {RSS_BAND:.0%} of the first one after the warm-up. Every sample is in "
        "`soak.json`.",
        "",
        f"{PERCENTILE_RULE_TEXT} The closed loop's (wrk) are taken from every latency wrk recorded, by "
        "the same rule.",
        "",
    ]
    return "\n".join(lines)


async def ramp(
    port: int, first: float, step: float, seconds: float, p99_limit: float
) -> list[dict[str, Any]]:
    """Open-loop steps of ``seconds`` from ``first`` req/s, each ``step`` times the last, until one is not
    sustained twice in a row (an error, under 97% of its requests answered in time, or a p99 above
    ``p99_limit`` ms; once may be a hiccup of the shared machine); every step's figures, the last one the
    second not sustained."""
    steps: list[dict[str, Any]] = []
    rate = first
    while True:
        load = OpenLoop(port, rate)
        began = time.perf_counter()
        await load.run(seconds)
        report = load.take() | {"rate": round(rate, 1), "wall": round(time.perf_counter() - began, 2)}
        offered = int(rate * seconds)
        report["sustained"] = (
            report["errors"] == 0
            and report["skipped"] == 0
            and report["wall"] <= seconds * 1.03 + 0.5  # the last answers came in time
            and report["answered"] >= 0.97 * offered
            and report["p99_ms"] is not None
            and report["p99_ms"] <= p99_limit
        )
        steps.append(report)
        print(
            f"ramp: {rate:6.0f} req/s -> p50 {report['p50_ms']} p99 {report['p99_ms']} ms, "
            f"errors {report['errors']}, {'sustained' if report['sustained'] else 'not sustained'}",
            flush=True,
        )
        await asyncio.sleep(1.0)  # let the step's queues drain
        if not report["sustained"]:
            if len(steps) >= 2 and steps[-2]["rate"] == report["rate"]:
                return steps
            continue  # the same rate once more
        rate *= step


def measure_capacity(
    stack: Stack, services: Services, args: argparse.Namespace, run_dir: Path
) -> dict[str, Any]:
    """The highest open-loop rate the stack sustained through Envoy (a ramp), with every process's CPU
    over the ramp; and a closed loop's throughput (wrk, or the Python client) for comparison."""
    port = stack.ports.gateway
    if shutil.which("wrk") is not None:
        closed = wrk_closed_loop(port, args.closed_seconds, args.connections, run_dir)
    else:
        closed = aio.run(python_closed_loop(port, BODIES, args.connections, args.closed_seconds))
        closed["client"] = f"python, {args.connections} connections"
    time.sleep(2.0)
    pids = services.pids | {"client": os.getpid()}
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    machine, began = machine_busy_seconds(), time.perf_counter()
    steps = aio.run(ramp(port, args.ramp_from, args.ramp_step, args.ramp_seconds, args.p99_limit))
    wall = time.perf_counter() - began
    cores = {name: round((cpu_seconds(pid) - before[name]) / wall, 2) for name, pid in pids.items()}
    cores["rest_of_machine"] = round((machine_busy_seconds() - machine) / wall - sum(cores.values()), 2)
    sustained = [step for step in steps if step["sustained"]]
    if not sustained:
        raise RuntimeError(f"not even {args.ramp_from:g} req/s was sustained: {steps[0]}")
    best = sustained[-1]
    requests = sum(step["answered"] for step in steps)
    picker_ms = round(cores["picker"] * wall / max(requests, 1) * 1000, 3)
    return {
        "per_s": best["rate"],
        "client": (
            f"an open-loop ramp ({args.ramp_seconds:g} s steps, x{args.ramp_step:g}, a failed step run twice)"
        ),
        "errors": best["errors"],
        "p99_ms": best["p99_ms"],
        "p99_limit_ms": args.p99_limit,
        "steps": steps,
        "cores_over_ramp": cores,
        "picker_cpu_ms_per_request": picker_ms,
        "limit": (
            f"the next step, {steps[-1]['rate']:.0f} req/s, was not: p99 {steps[-1]['p99_ms']} ms, "
            f"{steps[-1]['errors']} errors; the picker used {picker_ms} ms of CPU per request, "
            f"{cores['picker']:.2f} of a core over the ramp (cores: "
            + ", ".join(f"{n} {c:.2f}" for n, c in sorted(cores.items(), key=lambda kv: -kv[1]))
            + ")"
        ),
        "closed_loop": closed,
    }


def code_version() -> dict[str, Any]:
    """The commit, the files changed in the work tree, and a PYTHONPATH that would shadow them."""

    def git(*argv: str) -> str:
        done = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    changed = [line[3:] for line in git("status", "--porcelain").splitlines() if line[3:].endswith(".py")]
    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "changed_py": changed,
        "pythonpath": os.environ.get("PYTHONPATH"),
    }


def _without_note(argv: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--note":
            skip = True
        elif not arg.startswith("--note="):
            out.append(arg)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_minutes = float(os.environ.get("SOAK_MINUTES", "10"))
    parser.add_argument("--minutes", type=float, default=default_minutes, help="length (SOAK_MINUTES)")
    parser.add_argument("--fraction", type=float, default=0.8, help="of the measured capacity")
    parser.add_argument("--rate", type=float, help="req/s to drive (skips the capacity measurement)")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--warmup", type=float, help="seconds before the RSS level is taken (default 60)")
    parser.add_argument("--ramp-from", type=float, default=100.0, help="req/s of the ramp's first step")
    parser.add_argument("--ramp-step", type=float, default=1.2, help="each step's rate over the last's")
    parser.add_argument("--ramp-seconds", type=float, default=6.0, help="length of each step")
    parser.add_argument("--p99-limit", type=float, default=100.0, help="ms; a step above it is not sustained")
    parser.add_argument("--closed-seconds", type=float, default=8.0, help="the closed loop's length")
    parser.add_argument("--connections", type=int, default=16, help="the closed loop's connections")
    parser.add_argument(
        "--speedup", type=float, default=20.0, help="the simulator's (so its latency does not cap the loop)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "soak.json", help="the .md goes beside it")
    parser.add_argument("--note", default="", help="a line for the report (what was run, and why)")
    args = parser.parse_args()
    warmup = args.warmup if args.warmup is not None else min(60.0, args.minutes * 60 / 5)

    config = load_config(CONFIG, environ={})
    run_dir = Path(tempfile.mkdtemp(prefix="soak-"))
    environ = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    options = StackOptions(
        config_path=CONFIG,
        run_dir=run_dir,
        ports=StackPorts.free(len(config.pool.endpoints)),
        sim=SimOptions.for_config(config, speedup=args.speedup),
        environ=environ,
        allow_docker=False,
    )
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    code = code_version()
    calibration = calibration_ms()
    with Stack(options) as stack:
        services = Services.of(stack)
        print(f"stack up in {run_dir}; measuring the capacity ...", flush=True)
        capacity = measure_capacity(stack, services, args, run_dir)
        print(f"capacity: {json.dumps(capacity)}", flush=True)
        rate = args.rate if args.rate is not None else args.fraction * capacity["per_s"]
        if args.rate is not None:
            capacity["note"] = f"--rate {args.rate:g} given: the soak did not use this measurement"
        time.sleep(2.0)  # let the closed loop's connections and streams wind down before the first sample
        print(f"soak: {rate:.0f} req/s for {args.minutes:g} min", flush=True)
        run = aio.run(soak(services, stack.ports.gateway, rate, args.minutes * 60, args.every))
        stack.check()
    samples = run["samples"]
    loads = [s["loadavg"][0] for s in samples]
    result: dict[str, Any] = {
        "percentile_rule": PERCENTILE_RULE,
        "started": started,
        "command": " ".join(["bench/soak.py", *_without_note(sys.argv[1:])]),
        "code": code,
        "note": args.note,
        "minutes": args.minutes,
        "fraction": args.fraction if args.rate is None else None,
        "rate": round(rate, 1),
        "every": args.every,
        "warmup": warmup,
        "capacity": capacity,
        "verdict": verdict(samples, warmup, run["statuses"], run["skipped"]),
        "loadavg_range": [min(loads), max(loads)],
        "calibration_ms": calibration,
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "samples": samples,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    args.output.with_suffix(".md").write_text(markdown(result))
    print(json.dumps({k: v for k, v in result["verdict"].items() if k not in ("rss", "counts")}, indent=1))
    if result["verdict"]["passed"]:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        print(f"not passed: the stack's logs are in {run_dir}", flush=True)
    return 0 if result["verdict"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
