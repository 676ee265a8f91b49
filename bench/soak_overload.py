"""`make soak SOAK_MODE=overload`: the real local stack with flow control on, driven past the pods'
capacity (issue 20, "Live, through Envoy").

The simulator pods are slowed (``--speedup``, ``--max-num-seqs``) so that their capacity, and three
times it, stay far below what Envoy and the picker can do on this machine: what is measured is flow
control under overload, not the stack's own CPU saturating. Steps:

1. Start the stack as `make soak` does, with ``config/local.yaml`` plus a ``flowControl`` section
   (Critical requests wait up to 5 s, Sheddable up to 1 s).
2. The pods' capacity, without the router under test: a closed loop straight to each pod (two
   connections per sequence of its batch, so its queue keeps the batch full) for ``--calibrate``
   seconds, base-model requests only. That is the pods' ceiling: every sequence busy and no request
   waiting for an adapter slot. The simulator's own settings give nearly the same figure: pods x
   max-num-seqs / (8 engine steps of ~7 ms / speedup) per request of eight tokens, 107 req/s at the
   defaults (3 pods, 4 sequences, speedup 0.5); measured 103. The soak's mix (five adapters on pods
   of one LoRA slot, vLLM's default) needs adapter loads, so no routing serves it at the ceiling:
   1.5x of it is at least 1.5x of what the pods can serve of the mix, whichever profile routes it.
3. For each load of ``--loads`` (times the capacity): ``--minutes`` of open-loop requests at that rate,
   then ``--fall`` seconds at ``--fall-load`` times it (the load falls under what the mix gets served,
   ~0.3 of the ceiling: the queue must drain). The requests take turns over the bodies (base model,
   an adapter split four ways, an adapter, the same adapter Sheddable), from two tenants
   (``x-gateway-inference-fairness-id``, loud ten times as often as quiet). A sample every
   ``--every`` seconds: each service's RSS and CPU, the picker's queue (its
   ``inference_extension_flow_control_queue_size``) and outcomes.

Every request must get an answer: a 200, or a 429/503 whose body is JSON, within its time limit (its
band's TTL plus ``SLACK`` s of serving); none lost (no answer within 30 s, a broken connection).
Envoy's and the picker's RSS bounded: a load run a second time (the default ``1.5,3,3``) takes
neither higher than its first run did (its highest sample within 10% plus 5 MB of the first run's
highest). Envoy's allocator keeps the memory it freed, so its RSS does not fall back after a load; a
process that grows without bound passes its first high-water mark the second time. The queue empty
at the end of each fall. Writes bench/results/soak-overload.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import itertools
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parent))
from picker import Connection, calibration_ms
from soak import (
    CONFIG,
    LOOPBACK,
    MAX_LATE,
    PATH,
    RESULTS,
    SERVICES,
    Sampler,
    Services,
    _without_note,
    code_version,
    metric_values,
)

from pointsman_devstack.stack import SimOptions, Stack, StackOptions, StackPorts
from pointsman_shared import aio
from pointsman_shared.config import load_config
from pointsman_shared.stats import PERCENTILE_RULE, percentile

CRITICAL_TTL, SHEDDABLE_TTL = 5.0, 1.0
FLOW_CONTROL = {
    "enabled": True,
    "defaultRequestTTL": f"{CRITICAL_TTL:g}s",
    "priorityBands": [{"priority": 0}, {"priority": -1, "requestTTL": f"{SHEDDABLE_TTL:g}s"}],
}
# Eight tokens: a request holds its sequence for eight engine steps, ~120 ms at speedup 0.5, so the
# pods' capacity stays near 100 req/s (3x of it well within the stack's CPU) while an adapter load
# (~220 ms) costs about two requests' time, not eight.
MAX_TOKENS = 8
SLACK = 2.0  # seconds of serving allowed beyond a request's time in the queue
REQUEST_TIMEOUT = 30.0  # no answer by then: lost
TENANT = "x-gateway-inference-fairness-id"
MODELS = (
    ("meta-llama/Llama-3.1-8B-Instruct", CRITICAL_TTL),
    ("tweet-summary", CRITICAL_TTL),
    ("sql-lora", CRITICAL_TTL),
    ("sql-lora-sheddable", SHEDDABLE_TTL),
)
RSS_RISE = 0.10
RSS_FLOOR_MB = 5.0
QUEUE = "inference_extension_flow_control_queue_size"
DURATION = "inference_extension_flow_control_request_queue_duration_seconds"


EXPLAIN = "x-pointsman-explain"  # --explain: the picker's explain header, asked of tweet-summary's requests
SLOW = 6.0  # --explain: a 200 answered later than this is kept with how long it waited at the gateway
_WAITED = re.compile(rb"waited ([0-9.]+)s in flow control")


def request(port: int, model: str, tenant: str, explain: bool = False) -> bytes:
    body = json.dumps({"model": model, "prompt": "Summarize: points.", "max_tokens": MAX_TOKENS}).encode()
    asks = f"{EXPLAIN}: 1\r\n" if explain else ""
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: {LOOPBACK}:{port}\r\nContent-Type: application/json\r\n"
        f"{TENANT}: {tenant}\r\n{asks}Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class Answer(Connection):
    """A connection that keeps the last response (to check an error's body is JSON)."""

    def response(self) -> bytes:
        return bytes(self._buffer)


def json_body(response: bytes) -> bool:
    _, _, body = response.partition(b"\r\n\r\n")
    try:
        doc = json.loads(body)
    except ValueError:
        return False
    return isinstance(doc, dict) and "error" in doc


class Tally:
    """The answers since the last take, and in all."""

    def __init__(self) -> None:
        self.window: Counter[str] = Counter()
        self.total: Counter[str] = Counter()
        self.latencies: dict[str, list[float]] = {}
        self.window_latencies: list[float] = []
        self.late = 0
        self.slow: list[dict[str, Any]] = []  # --explain: slow 200s, their wait at the gateway
        self.bad_bodies = 0
        self.worst_over_limit = 0.0

    def add(self, status: str, seconds: float, limit: float, body_ok: bool) -> None:
        self.window[status] += 1
        self.total[status] += 1
        self.latencies.setdefault(status, []).append(seconds)
        if status == "200":
            self.window_latencies.append(seconds)
        if seconds > limit:
            self.late += 1
            self.worst_over_limit = max(self.worst_over_limit, seconds - limit)
        if status in ("429", "503") and not body_ok:
            self.bad_bodies += 1

    def take(self) -> dict[str, Any]:
        lat = sorted(self.window_latencies)
        out = {
            "statuses": dict(sorted(self.window.items())),
            "answered": sum(self.window.values()),
            "p50_ms": round(percentile(lat, 0.5) * 1000, 1) if lat else None,
            "p99_ms": round(percentile(lat, 0.99) * 1000, 1) if lat else None,
        }
        self.window, self.window_latencies = Counter(), []
        return out


class Load:
    """Open loop at ``rate``: request i due at start + i / rate, on a free keep-alive connection."""

    def __init__(self, port: int, rate: float, tally: Tally, explain: bool = False) -> None:
        self._port = port
        self._rate = rate
        self._tally = tally
        tenants = ["loud"] * 10 + ["quiet"]
        self._requests = itertools.cycle(
            [
                (request(port, model, tenant, explain and model == "tweet-summary"), ttl)
                for tenant in tenants
                for model, ttl in MODELS  # each tenant sends every body in turn
            ]
        )
        self._free: list[Answer] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.in_flight = 0
        self.skipped = 0

    async def run(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        start = time.perf_counter() + 0.05
        total = int(self._rate * seconds)
        i = 0
        while i < total:
            now = time.perf_counter()
            while i < total and start + i / self._rate <= now:
                due = start + i / self._rate
                i += 1
                if now - due > MAX_LATE:
                    self.skipped += 1
                    continue
                task = loop.create_task(self._one(*next(self._requests)))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            if i < total:
                await asyncio.sleep(max(0.0, start + i / self._rate - time.perf_counter()))

    async def finish(self) -> None:
        await asyncio.gather(*self._tasks)
        for conn in self._free:
            if conn.transport is not None:
                conn.transport.close()

    async def _one(self, payload: bytes, ttl: float) -> None:
        loop = asyncio.get_running_loop()
        sent = time.perf_counter()
        self.in_flight += 1
        conn: Answer | None = None
        body_ok = False
        try:
            conn = self._free.pop() if self._free else None
            if conn is None:
                _, conn = await loop.create_connection(Answer, LOOPBACK, self._port)
            async with asyncio.timeout(REQUEST_TIMEOUT):
                code = await conn.send(payload)
            status = str(code) if code else "broken"
            if code in (429, 503):
                body_ok = json_body(conn.response())
            took = time.perf_counter() - sent
            if code == 200 and took > SLOW:
                waited = _WAITED.search(conn.response())
                self._tally.slow.append(
                    {"seconds": round(took, 3), "waited": float(waited[1]) if waited else None}
                )
        except TimeoutError:
            status = "lost"
        except OSError:
            status = "connect"
        finally:
            self.in_flight -= 1
        self._tally.add(status, time.perf_counter() - sent, ttl + SLACK, body_ok)
        if conn is not None:
            if status in ("200", "429", "503") and not conn.closed:
                self._free.append(conn)
            elif conn.transport is not None:
                conn.transport.close()


async def pods_capacity(ports: tuple[int, ...], per_pod: int, seconds: float) -> dict[str, Any]:
    """What the pods serve, straight (no Envoy, no picker: the router under test does not set it),
    ``per_pod`` clients back to back on each: base-model requests only, so no request waits for an
    adapter slot and each pod's batch stays full. A ceiling no router exceeds on this mix, whose
    adapters need slot loads: 1.5x of it is at least 1.5x of what any routing serves."""
    loop = asyncio.get_running_loop()
    base = MODELS[0][0]
    statuses: Counter[int] = Counter()
    deadline = time.perf_counter() + seconds

    async def client(port: int) -> None:
        _, conn = await loop.create_connection(Answer, LOOPBACK, port)
        payload = request(port, base, "calibrate")
        while time.perf_counter() < deadline and not conn.closed:
            statuses[await conn.send(payload)] += 1
        if conn.transport is not None:
            conn.transport.close()

    began = time.perf_counter()
    await asyncio.gather(*(client(port) for port in ports for _ in range(per_pod)))
    wall = time.perf_counter() - began
    return {
        "per_s": round(statuses[200] / wall, 1),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "client": f"closed loop straight to the {len(ports)} pods, {per_pod} connections each, "
        f"{MODELS[0][0]} only, {seconds:g} s",
    }


def flow_figures(text: str) -> dict[str, Any]:
    """The picker's queue now and its outcomes so far."""
    queued = metric_values(text, QUEUE).get(QUEUE, 0.0)
    outcomes: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name == DURATION:
            for sample in family.samples:
                if sample.name == DURATION + "_count":
                    outcomes[sample.labels["outcome"]] += int(sample.value)
    return {"queued": queued, "outcomes": dict(sorted(outcomes.items()))}


async def phase(
    name: str,
    services: Services,
    sampler: Sampler,
    http: httpx.Client,
    port: int,
    rate: float,
    seconds: float,
    every: float,
    explain: bool = False,
) -> dict[str, Any]:
    tally = Tally()
    load = Load(port, rate, tally, explain)
    samples: list[dict[str, Any]] = []
    began = time.perf_counter()
    wall_began = time.time()
    driving = asyncio.create_task(load.run(seconds))

    async def sample() -> None:
        figures = await asyncio.to_thread(sampler.sample)
        text = await asyncio.to_thread(lambda: http.get(services.picker_metrics).text)
        entry = {
            "t": round(time.perf_counter() - began, 1),
            "client": tally.take() | {"in_flight": load.in_flight},
            "flow": flow_figures(text),
            "rss_mb": {n: figures["processes"][n]["rss_mb"] for n in SERVICES},
            "cores": figures["cores"],
            "rest_of_machine_cores": figures["rest_of_machine_cores"],
            "loadavg": figures["loadavg"],
        }
        samples.append(entry)
        c, f = entry["client"], entry["flow"]
        print(
            f"{name} t={entry['t']:5.0f}s {c['statuses']} p99 {c['p99_ms']} ms | queued {f['queued']:.0f} | "
            f"RSS envoy {entry['rss_mb']['envoy']:.0f} picker {entry['rss_mb']['picker']:.0f} MB | "
            f"cores picker {entry['cores']['picker']:.2f} envoy {entry['cores']['envoy']:.2f} | "
            f"load {entry['loadavg'][0]}",
            flush=True,
        )

    while not driving.done():
        await asyncio.wait(
            [driving], timeout=max(0.0, began + every * (len(samples) + 1) - time.perf_counter())
        )
        await sample()
    await driving
    await load.finish()  # every request sent has its answer (or was lost)
    await sample()
    latencies = {
        status: {
            "count": len(values),
            "p50_s": round(percentile(sorted(values), 0.5), 3),
            "p99_s": round(percentile(sorted(values), 0.99), 3),
            "max_s": round(max(values), 3),
        }
        for status, values in sorted(tally.latencies.items())
    }
    return {
        "name": name,
        "wall": [wall_began, time.time()],  # for Envoy's access log
        "rate": round(rate, 1),
        "seconds": seconds,
        "statuses": dict(sorted(tally.total.items())),
        "answered": sum(tally.total.values()),
        "skipped_by_the_client": load.skipped,
        "late": tally.late,
        "slow_200s": tally.slow,
        "worst_over_limit_s": round(tally.worst_over_limit, 3),
        "error_bodies_not_json": tally.bad_bodies,
        "latency": latencies,
        "samples": samples,
    }


# Envoy's answers that are a pod's or flow control's (any other is Envoy's own).
FLOW_ANSWERS = ("200 via_upstream", "429 pointsman", "503 pointsman")
_ACCESS = re.compile(
    r"^\[(?P<start>[^\]]+)\] \S+ POST \S+ upstream=\S+ status=(?P<status>\d+) flags=(?P<flags>\S+) "
    r"details=(?P<details>\S+) .*ms=(?P<ms>\d+)"
)


def gateway_figures(log: Path, phases: list[dict[str, Any]]) -> None:
    """Each phase's answers as Envoy logged them (``gateway``): by status and detail, their durations and
    how many passed their limit. The client's own figures include its lag on a starved machine; these
    are when the gateway answered."""
    entries = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        m = _ACCESS.match(line)
        if m is None:
            continue
        start = datetime.datetime.fromisoformat(m["start"].replace("Z", "+00:00")).timestamp()
        entries.append((start, m["status"], m["details"], int(m["ms"]) / 1000))
    for phase in phases:
        low, high = phase["wall"]
        mine = [e for e in entries if low <= e[0] < high]
        kinds: Counter[str] = Counter(f"{status} {details}" for _, status, details, _ in mine)
        durations: dict[str, list[float]] = {}
        late = 0
        for _, status, _details, seconds in mine:
            durations.setdefault(status, []).append(seconds)
            # A 429 is a Sheddable request's; a 200 or 503 may be a Critical one's.
            limit = (SHEDDABLE_TTL if status == "429" else CRITICAL_TTL) + SLACK
            late += seconds > limit
        phase["gateway"] = {
            "answers": kinds.most_common(),
            "late": late,
            "not_flow_control": sum(n for k, n in kinds.items() if not k.startswith(FLOW_ANSWERS)),
            "seconds": {
                status: {
                    "p50": round(percentile(sorted(v), 0.5), 3),
                    "p99": round(percentile(sorted(v), 0.99), 3),
                    "max": round(max(v), 3),
                }
                for status, v in sorted(durations.items())
            },
        }


def judge(overload: dict[str, Any], fall: dict[str, Any], first: dict[str, Any] | None) -> dict[str, Any]:
    """One load's verdict: its overload phase and the fall after it. ``first``: the verdict of an
    earlier run of the same load, against whose RSS this one's is judged (None: this is the first)."""
    answered_ok = ("200", "429", "503")
    lost = sum(n for phase in (overload, fall) for s, n in phase["statuses"].items() if s not in answered_ok)
    late = overload["gateway"]["late"] + fall["gateway"]["late"]
    client_late = overload["late"] + fall["late"]
    bad = overload["error_bodies_not_json"] + fall["error_bodies_not_json"]
    rss: dict[str, Any] = {}
    samples = overload["samples"] + fall["samples"]
    for name in ("envoy", "picker"):
        values = [s["rss_mb"][name] for s in samples]
        rss[name] = {"start_mb": values[0], "max_mb": max(values), "end_mb": values[-1]}
        if first is not None:
            # Bounded: the same load again takes the process no higher than the first time did
            # (Envoy's allocator keeps what it freed, so its RSS does not fall back after a load).
            before = first["rss"][name]["max_mb"]
            allowed = round(RSS_RISE * before + RSS_FLOOR_MB, 1)
            rss[name] |= {"first_max_mb": before, "allowed_mb": allowed}
            rss[name]["bounded"] = max(values) <= before + allowed
    drained = fall["samples"][-1]["flow"]["queued"] == 0
    max_queued = max(s["flow"]["queued"] for s in overload["samples"])
    bounded = None if first is None else all(r["bounded"] for r in rss.values())
    return {
        "every_request_answered": lost == 0,
        "lost": lost,
        "within_time_limit": late == 0,
        "late": late,
        "late_as_the_client_saw": client_late,
        "gateway_answers_not_flow_control": overload["gateway"]["not_flow_control"]
        + fall["gateway"]["not_flow_control"],
        "error_bodies_json": bad == 0,
        "rss_bounded": bounded,
        "rss": rss,
        "queue_drained": drained,
        "max_queued": max_queued,
        "passed": lost == 0 and late == 0 and bad == 0 and drained and bounded is not False,
    }


def markdown(result: dict[str, Any]) -> str:
    cap, machine = result["capacity"], result["machine"]
    mark = {True: "yes", False: "**no**"}
    lines = [
        "# Soak, overload: the local stack with flow control past the pods' capacity",
        "",
        f"Run {result['started']} on {machine['cpus']} shared vCPUs ({machine['platform']}), "
        f"`{result['command']}` (`make soak SOAK_MODE=overload`), commit {result['code']['commit']}. "
        + (f"{result['note']} " if result["note"] else "")
        + f"The simulator pods slowed (speedup {result['speedup']:g}, "
        f"max-num-seqs {result['max_num_seqs']}): "
        f"their capacity {cap['per_s']} req/s ({cap['client']}: {cap['statuses']}). Flow control "
        f"`{json.dumps(result['flow_control'])}`; bodies in turn (base model, tweet-summary, "
        f"sql-lora Critical, sql-lora-sheddable), tenants loud:quiet 10:1. "
        f"Each load for {result['minutes']:g} min, then "
        f"{result['fall']:g} s at {result['fall_load']:g}x; a sample every {result['every']:g} s. "
        f"A request's time limit: its band's TTL ({CRITICAL_TTL:g} s Critical, "
        f"{SHEDDABLE_TTL:g} s Sheddable) plus {SLACK:g} s.",
        "",
        "| load | req/s | answers (statuses) | lost | past its limit: gateway (client) | 429/503 bodies JSON "
        "| gateway p99 / max 200, 429, 503 (s) | queue max -> after the fall "
        "| Envoy RSS MB start / max / end "
        "| picker RSS MB start / max / end | RSS bounded "
        "| cores picker / envoy (mean) | load 1m | passed |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["loads"]:
        o, v = row["overload"], row["verdict"]
        lat = o["gateway"]["seconds"]
        p99 = ", ".join(
            f"{lat[s]['p99']} / {lat[s]['max']}" if s in lat else "-" for s in ("200", "429", "503")
        )
        bodies = mark[v["error_bodies_json"]]
        if v["gateway_answers_not_flow_control"]:
            other = [f"{n} {k}" for k, n in o["gateway"]["answers"] if not k.startswith(FLOW_ANSWERS)]
            bodies += f" ({'; '.join(other)})"
        env, pick = v["rss"]["envoy"], v["rss"]["picker"]
        cores = [s["cores"] for s in o["samples"]]
        cp = sum(c["picker"] for c in cores) / len(cores)
        ce = sum(c["envoy"] for c in cores) / len(cores)
        loads = [s["loadavg"][0] for s in o["samples"]]
        lines.append(
            f"| {row['load']:g}x | {o['rate']:.0f} | {o['answered']} ({o['statuses']}) | {v['lost']} "
            f"| {v['late']} ({v['late_as_the_client_saw']}) "
            f"| {bodies} | {p99} | {v['max_queued']:.0f} -> "
            f"{row['fall']['samples'][-1]['flow']['queued']:.0f} "
            f"| {env['start_mb']:.1f} / {env['max_mb']:.1f} / {env['end_mb']:.1f} "
            f"| {pick['start_mb']:.1f} / {pick['max_mb']:.1f} / {pick['end_mb']:.1f} "
            f"| {mark.get(v['rss_bounded'], '-')} | {cp:.2f} / {ce:.2f} "
            f"| {min(loads)}-{max(loads)} | {mark[v['passed']]} |"
        )
    lines += [
        "",
        "Outcomes in the picker (`inference_extension_flow_control_request_queue_duration_seconds` counts, "
        "cumulative): "
        + "; ".join(
            f"after {row['load']:g}x {row['fall']['samples'][-1]['flow']['outcomes']}"
            for row in result["loads"]
        ),
        "",
        "Past its limit: answered later than its band's TTL plus "
        f"{SLACK:g} s, as Envoy's access log times it (the client's own count in brackets: on a starved "
        "machine it adds its own lag). Lost: no answer within 30 s, or the connection broke. "
        "RSS bounded (a load run a second time): its highest RSS, over the load and its fall, within "
        f"{RSS_RISE:.0%} plus {RSS_FLOOR_MB:g} MB of the first run's highest (Envoy's allocator keeps what "
        "it freed: its RSS does not fall back after a load, but the same load again must not take it "
        "higher); a load's first run is not judged on RSS (-). Every sample is in `soak-overload.json`.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--loads",
        default=os.environ.get("SOAK_LOAD", "1.5,3,3"),
        help="times the capacity (SOAK_LOAD); a load named twice is judged on RSS against its first run",
    )
    parser.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", "2")))
    parser.add_argument("--fall", type=float, default=30.0, help="seconds at --fall-load after each load")
    parser.add_argument(
        "--fall-load",
        type=float,
        default=0.2,
        help="times the capacity after each load: under what the mix gets served (~0.3 of the ceiling)",
    )
    parser.add_argument("--every", type=float, default=5.0)
    parser.add_argument("--calibrate", type=float, default=10.0, help="seconds of the capacity's closed loop")
    parser.add_argument("--speedup", type=float, default=0.5, help="the simulator's")
    parser.add_argument("--max-num-seqs", type=int, default=4, help="the simulator's, per pod")
    parser.add_argument("--output", type=Path, default=RESULTS / "soak-overload.json")
    parser.add_argument("--note", default="")
    parser.add_argument(
        "--dispatch-deadline",
        choices=("on", "off"),
        default="on",
        help="flowControl.dispatchDeadline.enabled (on, the default: a held request its pod would answer"
        " past its limit is answered at the gateway; off: sent anyway, as before it existed)",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help=f"tweet-summary's requests ask for the explain header; each 200 slower than {SLOW:g} s is kept"
        " with its wait at the gateway (slow_200s)",
    )
    args = parser.parse_args(argv)
    flow_control = {**FLOW_CONTROL, "dispatchDeadline": {"enabled": args.dispatch_deadline == "on"}}

    run_dir = Path(tempfile.mkdtemp(prefix="soak-overload-"))
    doc = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    doc["flowControl"] = flow_control
    if args.explain:
        doc.setdefault("picker", {})["explainHeader"] = EXPLAIN
    config_path = run_dir / "overload.yaml"
    config_path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    config = load_config(config_path, environ={})
    environ = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    options = StackOptions(
        config_path=config_path,
        run_dir=run_dir,
        ports=StackPorts.free(len(config.pool.endpoints)),
        sim=SimOptions.for_config(config, speedup=args.speedup, max_num_seqs=args.max_num_seqs),
        environ=environ,
        allow_docker=False,
    )
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    code = code_version()
    calibration = calibration_ms()
    rows: list[dict[str, Any]] = []
    with Stack(options) as stack:
        services = Services.of(stack)
        port = stack.ports.gateway
        print(f"stack up in {run_dir}; the pods' capacity ...", flush=True)
        per_pod = 2 * args.max_num_seqs  # a queue as long as the batch keeps it full
        capacity = aio.run(pods_capacity(stack.ports.pods, per_pod, args.calibrate))
        print(f"capacity: {json.dumps(capacity)}", flush=True)
        sampler = Sampler(services)
        http = httpx.Client(timeout=5.0)
        try:
            for load in (float(x) for x in args.loads.split(",")):
                over = aio.run(
                    phase(
                        f"{load:g}x",
                        services,
                        sampler,
                        http,
                        port,
                        load * capacity["per_s"],
                        args.minutes * 60,
                        args.every,
                        args.explain,
                    )
                )
                fall = aio.run(
                    phase(
                        f"{load:g}x fall",
                        services,
                        sampler,
                        http,
                        port,
                        args.fall_load * capacity["per_s"],
                        args.fall,
                        args.every,
                    )
                )
                rows.append({"load": load, "overload": over, "fall": fall})
        finally:
            sampler.close()
            http.close()
        stack.check()
    gateway_figures(run_dir / "envoy.log", [p for row in rows for p in (row["overload"], row["fall"])])
    firsts: dict[float, dict[str, Any]] = {}
    for row in rows:
        row["verdict"] = judge(row["overload"], row["fall"], firsts.get(row["load"]))
        firsts.setdefault(row["load"], row["verdict"])
        print(json.dumps({k: v for k, v in row["verdict"].items() if k != "rss"}), flush=True)
    result: dict[str, Any] = {
        "percentile_rule": PERCENTILE_RULE,
        "started": started,
        "command": " ".join(
            ["bench/soak_overload.py", *_without_note(argv if argv is not None else sys.argv[1:])]
        ),
        "code": code,
        "note": args.note,
        "speedup": args.speedup,
        "max_num_seqs": args.max_num_seqs,
        "minutes": args.minutes,
        "fall": args.fall,
        "fall_load": args.fall_load,
        "every": args.every,
        "flow_control": flow_control,
        "capacity": capacity,
        "loads": rows,
        "passed": all(r["verdict"]["passed"] for r in rows),
        "calibration_ms": calibration,
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    args.output.with_suffix(".md").write_text(markdown(result))
    if result["passed"]:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        print(f"not passed: the stack's logs are in {run_dir}", flush=True)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
