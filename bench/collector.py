"""What the collector costs and how fresh its data is, with real-size pages over loopback.

Three processes: this one runs the collector (the real ``Collector``, ``PodScraper`` and Redis sink on
uvloop) and is the one whose CPU is measured; a pod server answers ``/metrics`` for every pod on its own
loopback port with the fixture pages of ``shared/tests/data/vllm-metrics`` grown to real vLLM sizes
(``PAGE_KB``: each of the four pages at each of 27, 45, 64 and 82 KB, the pods taking the 16 in turn,
54 KB on average; ``--page-kb N`` grows every page to N KB instead, 0 keeps the 16-30 KB fixtures); an
observer subscribes to the pool's Redis channel. Every ``TICK`` seconds the pod server raises every
pod's waiting queue to the tick number, and every response carries a new running count and KV use
(as a busy pod's pages do, so no two pages repeat those lines); the observer notes when each pod's new
waiting value first shows in Redis (its metric age).

- paced: ``--pods`` pods every ``--interval``; CPU of this process per wall second, and late rounds (the
  pod server sees two requests to one pod more than 1.5 intervals apart);
- flat out: the same pods with a 1 ms interval; scrapes per second.

Prints the numbers and writes bench/results/collector.json. Takes about 25 s; every process it starts
ends with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import functools
import gc
import itertools
import json
import multiprocessing
import os
import re
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

import orjson
import uvloop
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from pointsman_collector.loop import Collector
from pointsman_collector.scrape import PodScraper
from pointsman_collector.sink import RedisSnapshotSink
from pointsman_devstack.redis_server import start_redis
from pointsman_shared.keys import RedisKeys
from pointsman_shared.model_server import PRESETS
from pointsman_shared.stats import PERCENTILE_RULE, mean, percentile

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "collector.json"
PAGES = ROOT / "shared" / "tests" / "data" / "vllm-metrics"
PAGE_NAMES = ("vllm-current-lora", "vllm-data-parallel", "vllm-idle-newest-empty", "vllm-v0-lora")
# Real vLLM pages run 27-82 KB (more histograms and label sets than the fixtures): the default spreads
# the pods over that range.
PAGE_KB = (27, 45, 64, 82)
POOL = "bench-pool"
TICK = 0.2  # how often every pod's waiting queue changes
WARMUP = 2.0
BOUND = 120.0  # seconds the whole benchmark may take
LATE = 1.5  # a gap between two scrapes of one pod longer than this many intervals is a late round
# The sample lines whose values the pod server changes: the waiting queue (the tick, for metric age) and,
# as on a busy pod, the running count and KV use (different on every response of every pod).
_CHANGING = re.compile(
    rb"^(vllm:(num_requests_waiting|num_requests_running|kv_cache_usage_perc|gpu_cache_usage_perc)"
    rb"(?:\{[^\n]*\})?) [^\n]*$",
    re.MULTILINE,
)


# --- the pod server (its own process) -------------------------------------------------------------


class _PagePod(asyncio.Protocol):
    """Answers each GET with the current page of its template; notes when requests arrive."""

    def __init__(self, server: _PodServer, template: int, arrivals: list[float]) -> None:
        self._server = server
        self._template = template
        self._arrivals = arrivals
        self._transport: asyncio.Transport | None = None
        self._buffer = b""
        self._served = 0  # this pod's responses so far: its running count and KV use follow it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while (end := self._buffer.find(b"\r\n\r\n")) >= 0:
            self._buffer = self._buffer[end + 4 :]
            self._arrivals.append(time.monotonic())
            assert self._transport is not None
            self._served += 1
            self._transport.write(self._server.response(self._template, self._served))


class _PodServer:
    def __init__(self, start: float, page_kb: tuple[int, ...]) -> None:
        self._start = start
        fixtures = [(PAGES / f"{name}.txt").read_bytes() for name in PAGE_NAMES]
        pages = [_grown(page, kb) for kb in page_kb for page in fixtures]
        self.variants = len(pages)
        self._templates = [_template(page) for page in pages]

    def response(self, template: int, served: int) -> bytes:
        tick = max(0, int((time.time() - self._start) / TICK))
        return _render(self._templates[template], tick, served)


def _grown(page: bytes, page_kb: int) -> bytes:
    """The page with renamed copies of its own families after it, cut at a line end near ``page_kb`` KB.

    Real vLLM pages run 27-82 KB: more histograms and label sets than the fixtures. vLLM registers its
    gauges (the families Pointsman reads) before its histograms, so the growth goes after them; what
    grows is what crosses the socket and what a family absent from the page is searched through.
    """
    grown = page
    while len(grown) < page_kb * 1024:
        grown += page.replace(b"vllm:", b"vllm:copy%d_" % (len(grown) // len(page)))
    if len(grown) == len(page):
        return page
    return grown[: grown.index(b"\n", page_kb * 1024) + 1]


Template = list[tuple[bytes, bytes]]  # (text before a changing value, which family's value it is)


def _template(page: bytes) -> Template:
    """The page cut around its changing values; the last part has no value after it."""
    parts: Template = []
    last = 0
    for match in _CHANGING.finditer(page):
        parts.append((page[last : match.end(1)] + b" ", match.group(2)))
        last = match.end()
    parts.append((page[last:], b""))
    return parts


def _render(template: Template, tick: int, served: int) -> bytes:
    """The first engine's waiting queue is the tick, other engines' 0; running and KV use move with
    every response, so consecutive pages of a pod, and the pages of any two pods, differ in them."""
    out: list[bytes] = []
    first_waiting = True
    for text, family in template:
        out.append(text)
        if family == b"num_requests_waiting":
            out.append(b"%d.0" % tick if first_waiting else b"0.0")
            first_waiting = False
        elif family == b"num_requests_running":
            out.append(b"%d.0" % (served % 41))
        elif family:
            out.append(b"0.%06d" % (served * 7919 % 1_000_000))
    body = b"".join(out)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n\r\n"
    return head % len(body) + body


def serve_pods(pods: int, start: float, page_kb: tuple[int, ...], conn: Connection) -> None:
    uvloop.run(_serve_pods(pods, start, page_kb, conn))


async def _serve_pods(pods: int, start: float, page_kb: tuple[int, ...], conn: Connection) -> None:
    loop = asyncio.get_running_loop()
    server = _PodServer(start, page_kb)
    arrivals: list[list[float]] = [[] for _ in range(pods)]
    listeners = []
    for i in range(pods):
        pod = functools.partial(_PagePod, server, i % server.variants, arrivals[i])
        listener = await loop.create_server(pod, "127.0.0.1", 0)
        listeners.append(listener)
    sizes = [len(server.response(i % server.variants, 0)) for i in range(pods)]
    conn.send(([listener.sockets[0].getsockname()[1] for listener in listeners], sizes))
    # Commands: "mark" starts a new window (returns nothing), "gaps" returns the window's numbers.
    # The pod server's own CPU says whether it, not the collector, bounds the flat-out rate.
    marked = (time.monotonic(), time.process_time())
    while True:
        command = await loop.run_in_executor(None, conn.recv)
        if command == "stop":
            break
        if command == "mark":
            marked = (time.monotonic(), time.process_time())
            for times in arrivals:
                times.clear()
        elif command == "gaps":
            gaps = [b - a for times in arrivals for a, b in itertools.pairwise(times)]
            cpu = (time.process_time() - marked[1]) / (time.monotonic() - marked[0])
            conn.send({"requests": sum(len(t) for t in arrivals), "gaps": gaps, "cpu_fraction": cpu})
    for listener in listeners:
        listener.close()


# --- the observer (its own process) ---------------------------------------------------------------


def observe(redis_url: str, start: float, conn: Connection) -> None:
    uvloop.run(_observe(redis_url, start, conn))


async def _observe(redis_url: str, start: float, conn: Connection) -> None:
    """Metric age: for each pod and tick, when a waiting value >= the tick first shows in Redis."""
    keys = RedisKeys(POOL)
    client = Redis.from_url(redis_url)
    pubsub = client.pubsub()
    await pubsub.subscribe(keys.channel)
    seen: dict[str, int] = {}
    ages: list[float] = []
    recording = False
    conn.send("ready")
    loop = asyncio.get_running_loop()
    command = loop.run_in_executor(None, conn.recv)
    while True:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.05)
        if command.done():
            if command.result() == "stop":
                break
            recording = command.result() == "record"
            if command.result() == "ages":
                conn.send(ages)
                ages = []
            command = loop.run_in_executor(None, conn.recv)
        if message is None or not recording:
            continue  # idle, it leaves the other core to the pod server (flat out: ~2,000 publishes/s)
        data = await client.hget(keys.snapshot, "data")
        now = time.time()
        if data is None:
            continue
        for pod in orjson.loads(data)["pods"]:
            if not pod["healthy"]:
                continue  # a pending pod's zeros were never read from it
            value, before = pod["waiting"], seen.get(pod["address"], -1)
            if value > before:
                seen[pod["address"]] = value
                if before >= 0:
                    # Every tick passed since the last value seen changed this pod; the oldest counts.
                    ages.extend(now - (start + tick * TICK) for tick in range(before + 1, value + 1))
    await pubsub.aclose()  # type: ignore[no-untyped-call]
    await client.aclose()


# --- the collector (this process) -----------------------------------------------------------------


async def run_collector(
    ports: list[int],
    redis_url: str,
    interval: float,
    seconds: float,
    pods_conn: Connection,
    obs_conn: Connection | None = None,
) -> dict[str, float]:
    registry = CollectorRegistry()
    sink = RedisSnapshotSink.from_url(redis_url, RedisKeys(POOL), ttl=10.0)
    names = PRESETS["vllm"]
    collector = Collector(
        pool=POOL,
        scraper_factory=lambda address: PodScraper(address, names, timeout=1.0),
        sink=sink,
        registry=registry,
        interval=interval,
        first_round_timeout=1.0,
    )
    collector.start(f"127.0.0.1:{port}" for port in ports)
    await asyncio.sleep(WARMUP)
    pods_conn.send("mark")
    if obs_conn is not None:
        obs_conn.send("record")
    scrapes = _scrapes(registry)
    errors = _errors(registry)
    publishes = _publishes(registry)
    wall, cpu = time.monotonic(), time.process_time()
    await asyncio.sleep(seconds)
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    if obs_conn is not None:
        obs_conn.send("idle")
    scrapes = _scrapes(registry) - scrapes
    errors = _errors(registry) - errors
    publishes = _publishes(registry) - publishes
    await collector.stop()
    await sink.aclose()
    return {
        "wall_s": wall,
        "cpu_fraction": cpu / wall,
        "scrapes_per_s": scrapes / wall,
        "cpu_us_per_scrape": cpu / scrapes * 1e6 if scrapes else float("nan"),
        "errors": errors,
        "publishes_per_s": publishes / wall,
    }


def _scrapes(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("pointsman_collector_scrape_duration_seconds_count") or 0.0


def _publishes(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("pointsman_collector_publish_duration_seconds_count") or 0.0


def _errors(registry: CollectorRegistry) -> float:
    return sum(
        sample.value
        for metric in registry.collect()
        if metric.name == "pointsman_collector_scrape_errors"
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between scrapes of a pod")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds of each phase")
    parser.add_argument(
        "--page-kb", type=int, help="grow every page to at least this size (0: the fixtures as they are)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    # A bounded run: if anything hangs, print every thread's stack and exit instead of waiting forever.
    faulthandler.dump_traceback_later(BOUND, exit=True)

    environ = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    redis = start_redis(environ, allow_docker=False)
    spawn = multiprocessing.get_context("spawn")
    page_kb = PAGE_KB if args.page_kb is None else (args.page_kb,)
    start = time.time() + 1.0
    pods_conn, pods_end = spawn.Pipe()
    obs_conn, obs_end = spawn.Pipe()
    pod_server = spawn.Process(target=serve_pods, args=(args.pods, start, page_kb, pods_end), daemon=True)
    observer = spawn.Process(target=observe, args=(redis.url, start, obs_end), daemon=True)
    try:
        pod_server.start()
        observer.start()
        ports, sizes = pods_conn.recv()
        obs_conn.recv()

        gc.freeze()  # as pointsman-collector does before it starts its loop
        paced = uvloop.run(run_collector(ports, redis.url, args.interval, args.seconds, pods_conn, obs_conn))
        obs_conn.send("ages")
        ages = [age * 1000 for age in obs_conn.recv()]
        pods_conn.send("gaps")
        window = pods_conn.recv()
        late = sum(gap > LATE * args.interval for gap in window["gaps"])

        flat = uvloop.run(run_collector(ports, redis.url, 0.001, min(args.seconds, 5.0), pods_conn))
        pods_conn.send("gaps")
        flat_pods_cpu = pods_conn.recv()["cpu_fraction"]
    finally:
        for conn in (pods_conn, obs_conn):
            with contextlib.suppress(OSError):
                conn.send("stop")
        for process in (pod_server, observer):
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
        redis.stop()

    result: dict[str, Any] = {
        "percentile_rule": PERCENTILE_RULE,
        "pods": args.pods,
        "page_kb": list(page_kb),
        "response_kb_min_mean_max": [round(f(sizes) / 1024, 1) for f in (min, mean, max)],
        "interval_ms": args.interval * 1000,
        "paced_cpu_fraction": round(paced["cpu_fraction"], 3),
        "paced_cpu_us_per_scrape": round(paced["cpu_us_per_scrape"], 1),
        "paced_scrapes_per_s": round(paced["scrapes_per_s"]),
        "paced_late_rounds": late,
        "paced_rounds": len(window["gaps"]),
        "paced_gap_p99_ms": round(percentile(window["gaps"], 0.99) * 1000, 1) if window["gaps"] else None,
        "paced_scrape_errors": paced["errors"],
        "paced_publishes_per_s": round(paced["publishes_per_s"]),
        "max_scrapes_per_s": round(flat["scrapes_per_s"]),
        "flat_out_cpu_us_per_scrape": round(flat["cpu_us_per_scrape"], 1),
        # What one whole core would do: the machine is shared, so wall-clock throughput varies.
        "flat_out_scrapes_per_cpu_s": round(1e6 / flat["cpu_us_per_scrape"]),
        "flat_out_scrape_errors": flat["errors"],
        "flat_out_cpu_fraction": round(flat["cpu_fraction"], 3),
        "flat_out_publishes_per_s": round(flat["publishes_per_s"]),
        "flat_out_pod_server_cpu_fraction": round(flat_pods_cpu, 3),
        "metric_age_samples": len(ages),
        "metric_age_p50_ms": round(percentile(ages, 0.5), 1) if ages else None,
        "metric_age_p99_ms": round(percentile(ages, 0.99), 1) if ages else None,
        "metric_age_max_ms": round(max(ages), 1) if ages else None,
        "pages": list(PAGE_NAMES),
        "cpus": os.cpu_count(),
    }
    for key, value in result.items():
        print(f"{key:28} {value}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
