"""`make bench-picker`: the picker behind a real Envoy, side by side with Envoy alone and vllm-router.

One run, one machine, the same backend "pods" behind every setup. The pods cost almost nothing: one
Envoy (``--concurrency 1``) with a listener per pod, each answering POST /v1/completions with a small
OpenAI completion (with ``usage``) and GET /metrics with a real vLLM page, which the real collector
scrapes into Redis. So the numbers are the proxies' and the picker's, not a simulator's.

Setups (each front Envoy ``--concurrency 1``, no access log):

- Envoy alone: round robin over the pods, no ext_proc (the floor);
- Envoy + one picker, Envoy sending requests only, body FULL_DUPLEX_STREAMED (the local stack's
  request side: one round trip to the picker per request);
- the same with the body BUFFERED (headers SEND + body BUFFERED, the issue's shape: two round trips);
- Envoy + one picker with response processing on (the local stack's default);
- Envoy + two picker processes as two endpoints of the ext_proc cluster (requests only);
- vllm-router (PyPI, Rust) in front of the same pods (round_robin; its default cache_aware in detail),
  when `.venv-bench` has it (the bench target installs it there, pinned in requirements/bench.txt).

The picker setups run once per ext_proc server (``--servers``, config ``picker.server``); the top-level
keys come from the default server, every server's numbers are in ``detail.servers``.

Throughput: ``wrk`` closed loop (``--connections`` back to back; the Python client when wrk is
missing, noted in the json). Latency: an open-loop Python client at ``--rate`` req/s: each request is
sent when due on a free keep-alive connection (a new one when none is free, so a slow server never
holds the sending back) and timed from then; ``send_lag_p99_ms`` says how late the client itself sent.
CPU per decision: the picker process's user + system CPU over a run / the requests of that run; the
headline ``cpu_us_per_decision`` is the requests-only shape under wrk. Every run also records each
process's CPU per request, the cores the rest of the machine used, and a CPU-speed calibration: on a
shared virtual machine the same setup's CPU per request moves with them. Writes
bench/results/picker.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from decision_cost import bench_director, bench_schedule

from pointsman_devstack import envoy
from pointsman_devstack.ports import free_port
from pointsman_devstack.process import ManagedProcess
from pointsman_devstack.readiness import grpc_serving, http_ok, wait_ready
from pointsman_devstack.redis_server import RedisServer, start_redis
from pointsman_devstack.stack import StackPorts, derive_config
from pointsman_shared import aio
from pointsman_shared.config import PickerConfig, load_config
from pointsman_shared.stats import PERCENTILE_RULE, PERCENTILE_RULE_TEXT, percentile

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "picker.json"
CONFIG = ROOT / "config" / "local.yaml"
ROUTER = ROOT / ".venv-bench" / "bin" / "vllm-router"
METRICS_PAGE = ROOT / "shared" / "tests" / "data" / "vllm-metrics" / "vllm-current-lora.txt"
VENV_BIN = Path(sys.executable).parent
HOST = "127.0.0.1"
PATH = "/v1/completions"
SERVERS = ("native", "grpcio")
JSON = {"content-type": "application/json"}
# Through the picker: a model with targets, so every decision also rewrites the body. Envoy alone and
# vllm-router cannot rewrite, so they get the base model under its own name.
REWRITTEN_MODEL = "tweet-summary"
PLAIN_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
REWRITTEN = json.dumps({"model": REWRITTEN_MODEL, "prompt": "Summarize: points.", "max_tokens": 1}).encode()
PLAIN = json.dumps({"model": PLAIN_MODEL, "prompt": "Summarize: points.", "max_tokens": 1}).encode()
COMPLETION = json.dumps(
    {
        "id": "cmpl-bench",
        "object": "text_completion",
        "created": 0,
        "model": "tweet-summary-0",
        "choices": [{"index": 0, "text": " Points.", "finish_reason": "length", "logprobs": None}],
        "usage": {"prompt_tokens": 6, "completion_tokens": 1, "total_tokens": 7},
    }
)
_TYPE = "type.googleapis.com/"
_HCM = _TYPE + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_ROUTER = _TYPE + "envoy.extensions.filters.http.router.v3.Router"


# -- processes ------------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def calibration_ms() -> float:
    """A fixed piece of Python work, best of 5: how fast this shared, virtual CPU was just now, so
    two runs' CPU per request can be compared."""
    best = float("inf")
    for _ in range(5):
        began = time.perf_counter()
        json.loads(json.dumps([{"n": i, "s": str(i)} for i in range(20_000)]))
        best = min(best, time.perf_counter() - began)
    return round(best * 1000, 2)


def machine_busy_seconds() -> float:
    """CPU time the whole machine spent busy so far (every core, every process: others' work too)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@dataclass
class Usage:
    """What one run cost: CPU seconds per named process, the wall time, the machine's busy seconds."""

    seconds: dict[str, float]
    wall: float = 0.0
    machine: float = 0.0

    def report(self, requests: int) -> dict[str, Any]:
        """CPU per request of each process, and the cores each used; ``rest_of_machine`` is what
        the processes measured here do not explain (other people's work on a shared machine)."""
        rest = self.machine - sum(self.seconds.values())
        return {
            "cpu_us_per_request": {n: round(s / max(1, requests) * 1e6, 1) for n, s in self.seconds.items()},
            "cores": {n: round(s / self.wall, 2) for n, s in self.seconds.items()}
            | {"rest_of_machine": round(rest / self.wall, 2)},
        }


@dataclass
class Meter:
    """CPU of named processes (and this one, the Python client, as ``bench``) over one run."""

    pids: dict[str, int]

    @contextmanager
    def run(self) -> Iterator[Usage]:
        pids = {**self.pids, "bench": os.getpid()}
        usage = Usage({})
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        machine, began = machine_busy_seconds(), time.perf_counter()
        yield usage
        usage.wall = time.perf_counter() - began
        usage.machine = machine_busy_seconds() - machine
        usage.seconds.update({name: cpu_seconds(pid) - before[name] for name, pid in pids.items()})


def start_envoy(doc: dict[str, Any], name: str, run_dir: Path) -> ManagedProcess:
    admin = doc["admin"]["address"]["socket_address"]["port_value"]
    path = run_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    argv = [envoy.find_envoy(), "-c", str(path), "--disable-hot-restart", "--concurrency", "1"]
    argv += ["--log-level", "warning"]
    process = ManagedProcess(name, argv, env={}, log_path=run_dir / f"{name}.log")
    with httpx.Client(timeout=1.0) as client:
        wait_ready(process, http_ok(client, f"http://{HOST}:{admin}/ready"), timeout=30, what="admin /ready")
    return process


def wait_completion(process: ManagedProcess, port: int, body: bytes, timeout: float = 30.0) -> None:
    """Ready once a completion through ``port`` answers 200 (the whole path works)."""
    with httpx.Client(timeout=1.0) as client:

        def probe() -> str | None:
            try:
                response = client.post(f"http://{HOST}:{port}{PATH}", content=body, headers=JSON)
            except httpx.HTTPError as exc:
                return f"{type(exc).__name__} {exc}"
            return None if response.status_code == 200 else f"HTTP {response.status_code}"

        wait_ready(process, probe, timeout=timeout, what=f"a completion through :{port}")


def _address(port: int) -> dict[str, Any]:
    return {"socket_address": {"address": HOST, "port_value": port}}


def _direct(match: dict[str, str], body: str, content_type: str) -> dict[str, Any]:
    return {
        "match": match,
        "direct_response": {"status": 200, "body": {"inline_string": body}},
        "response_headers_to_add": [{"header": {"key": "content-type", "value": content_type}}],
    }


def backend_bootstrap(pods: Sequence[int], admin: int) -> dict[str, Any]:
    """One Envoy, one listener per pod: direct responses for /metrics and for every other path."""
    page = METRICS_PAGE.read_text(encoding="utf-8")
    routes = [
        _direct({"path": "/metrics"}, page, "text/plain; version=0.0.4; charset=utf-8"),
        _direct({"prefix": "/"}, COMPLETION, "application/json"),
    ]

    def listener(port: int) -> dict[str, Any]:
        hcm = {
            "@type": _HCM,
            "stat_prefix": f"pod_{port}",
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}}],
            "route_config": {
                # The default cap (4 KB) is below a real vLLM page.
                "max_direct_response_body_size_bytes": 1 << 20,
                "virtual_hosts": [{"name": "pod", "domains": ["*"], "routes": routes}],
            },
        }
        return {
            "name": f"pod_{port}",
            "address": _address(port),
            "filter_chains": [{"filters": [{"name": "hcm", "typed_config": hcm}]}],
        }

    return {
        "admin": {"address": _address(admin)},
        "static_resources": {"listeners": [listener(p) for p in pods]},
    }


def _hcm(doc: dict[str, Any]) -> dict[str, Any]:
    hcm: dict[str, Any] = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]
    return hcm


def front_bootstrap(
    pickers: Sequence[int],
    *,
    responses: bool,
    body_mode: str | None = None,
    response_body: str = envoy.ACCESS_LOG,
    tracing: envoy.EnvoyTracing | None = None,
    body_without_waiting: bool = False,
) -> tuple[dict[str, Any], int]:
    """The local stack's Envoy in front of ``pickers``, without its stdout access log (one line per
    request would cost Envoy more than some of what is measured; the gRPC one to the pickers stays, it
    is part of the mode); returns it and its gateway port."""
    gateway = free_port()
    options = envoy.EnvoyOptions(
        gateway_listen=f"{HOST}:{gateway}",
        admin_listen=f"{HOST}:{free_port()}",
        pickers=tuple(f"{HOST}:{p}" for p in pickers),
        response_processing=responses,
        request_body_mode=body_mode,
        response_body=response_body,
        tracing=tracing,
        body_without_waiting=body_without_waiting,
    )
    doc = envoy.bootstrap(options)
    hcm = _hcm(doc)
    hcm["access_log"] = [log for log in hcm["access_log"] if log["name"] != "envoy.access_loggers.stdout"]
    if not hcm["access_log"]:
        hcm.pop("access_log")
    return doc, gateway


def alone_bootstrap(pods: Sequence[int], *, lua: bool = False) -> tuple[dict[str, Any], int]:
    """The same listener minus ext_proc, round robin over the pods; with ``lua``, the usage filter
    (deploy/envoy/usage.lua) before the router, as shipped (its metadata then goes nowhere)."""
    doc, gateway = front_bootstrap([1], responses=False)
    hcm = _hcm(doc)
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != "envoy.filters.http.ext_proc"]
    if lua:
        hcm["http_filters"].insert(0, envoy.usage_filter())
    hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"] = "pods"
    pod_cluster = next(c for c in doc["static_resources"]["clusters"] if c["name"] == envoy.POD_CLUSTER)
    doc["static_resources"]["clusters"] = [
        {
            "name": "pods",
            "type": "STATIC",
            "connect_timeout": "1s",
            "circuit_breakers": pod_cluster["circuit_breakers"],
            "load_assignment": {
                "cluster_name": "pods",
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(p)}} for p in pods]}],
            },
        }
    ]
    return doc, gateway


class Pickers:
    """Redis and the collector over the backend pods; pickers started and stopped per server."""

    def __init__(self, pods: Sequence[int], run_dir: Path, against: Path | None = None) -> None:
        self.run_dir = run_dir
        self.against = against
        self.config = load_config(CONFIG, environ={})
        self.ports = replace(StackPorts.free(len(pods)), pods=tuple(pods))
        self.env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        self.redis: RedisServer = start_redis(self.env, allow_docker=False)
        self.env.update(REDIS_URL=self.redis.url, PYTHONUNBUFFERED="1")
        self.processes: list[ManagedProcess] = []
        try:
            doc = derive_config(self.config, self.ports, self.redis.url, HOST)
            path = run_dir / "pointsman.yaml"
            path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
            argv = [str(VENV_BIN / "pointsman-collector"), "--config", str(path)]
            self.collector = self._spawn("collector", argv)
            url = f"http://{HOST}:{self.ports.collector}/readyz"
            with httpx.Client(timeout=1.0) as client:
                wait_ready(self.collector, http_ok(client, url), timeout=30, what="/readyz 200")
        except BaseException:
            self.stop()
            raise

    def start_picker(
        self,
        name: str,
        label: str,
        tracing: dict[str, Any] | None = None,
        profile: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
    ) -> tuple[ManagedProcess, int]:
        """A picker with ``picker.server`` from ``label`` (``native``, or ``native@before``: the picker
        package of ``--against``'s tree), the ``tracing`` section and a ``profile`` (a profile file's
        ``picker``, ``plugins`` and ``profiles``) on fresh ports, with ``env`` added to its environment
        (a ``PYTHONPATH`` there goes after the tree's); returns it and its ext_proc port."""
        server, _, tree = label.partition("@")
        ext_proc, health, metrics = free_port(), free_port(), free_port()
        doc = derive_config(self.config, self.ports, self.redis.url, HOST)
        if tracing is not None:
            doc["tracing"] = tracing
        if profile is not None:
            doc["picker"].update(profile.get("picker", {}))
            doc.update({k: profile[k] for k in ("plugins", "profiles") if k in profile})
        doc["picker"].update(
            listen=f"{HOST}:{ext_proc}",
            healthListen=f"{HOST}:{health}",
            metricsListen=f"{HOST}:{metrics}",
            server=server,
        )
        path = self.run_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        extra = dict(env or {})
        if tree:
            assert self.against is not None
            paths = [str(self.against / "services" / "picker" / "src"), extra.get("PYTHONPATH", "")]
            extra["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        argv = [str(VENV_BIN / "pointsman-picker"), "--config", str(path)]
        process = self._spawn(name, argv, self.env | extra if extra else None)
        wait_ready(process, grpc_serving(f"{HOST}:{health}"), timeout=30, what="gRPC health SERVING")
        return process, ext_proc

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> ManagedProcess:
        log_path = self.run_dir / f"{name}.log"
        process = ManagedProcess(name, argv, env=self.env if env is None else env, log_path=log_path)
        self.processes.append(process)
        return process

    def stop_picker(self, process: ManagedProcess) -> None:
        process.stop(5)
        self.processes.remove(process)

    def stop(self) -> None:
        while self.processes:
            self.processes.pop().stop(5)
        self.redis.stop()


# -- load -----------------------------------------------------------------------------------------
_STATUS = re.compile(rb"HTTP/1\.1 (\d{3})")
_LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding: *chunked", re.IGNORECASE)
_CLOSE = re.compile(rb"\r\nconnection: *close", re.IGNORECASE)


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time: a Protocol with a minimal response
    parser, to keep the load generator's CPU (measured as ``bench``) small."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buffer = bytearray()
        self._done: asyncio.Future[int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._done is not None and not self._done.done():
            self._done.set_result(0)

    def send(self, request: bytes) -> asyncio.Future[int]:
        """The response's status once it has fully arrived (0 if the connection broke)."""
        assert self.transport is not None
        self._done = asyncio.get_running_loop().create_future()
        self._buffer.clear()
        self.transport.write(request)
        return self._done

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0 or self._done is None or self._done.done():
            return  # (done: given up on, e.g. cancelled by its caller's timeout)
        head = bytes(self._buffer[:end])
        length = _LENGTH.search(head)
        if length is not None:
            complete = len(self._buffer) - end - 4 >= int(length[1])
        elif _CHUNKED.search(head):
            # One response at a time and JSON bodies: the last chunk is the end of the buffer.
            complete = self._buffer.endswith(b"\r\n0\r\n\r\n")
        else:
            complete = True
        if not complete:
            return
        status = _STATUS.match(head)
        self._done.set_result(int(status[1]) if status else 0)
        if _CLOSE.search(head) and self.transport is not None:
            self.transport.close()


@contextmanager
def no_gc() -> Iterator[None]:
    """The client's cyclic GC off for a latency run: this process holds every result so far, and one
    full pass over it took 48 ms (bench/results/HISTORY.md, 2026-12-04), which the requests in flight
    then counted as the proxies' latency."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def http_request(port: int, body: bytes) -> bytes:
    head = f"POST {PATH} HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: application/json\r\n"
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


async def fixed_rate(
    port: int,
    body: bytes,
    rate: float,
    seconds: float,
    *,
    clock: Callable[[], float] = time.perf_counter,
    raw: bool = False,
) -> dict[str, Any]:
    """Open loop: request i is due at start + i / rate and is sent then on a free connection (a new
    one when none is free); its latency counts from the send, ``send_lag`` from when it was due.
    ``raw``: also every served request's send time on ``clock`` and latency (bench/picker_tail.py
    lines them up with a probed picker's events)."""
    loop = asyncio.get_running_loop()
    request = http_request(port, body)
    free: list[Connection] = []
    opened: list[Connection] = []
    sends: list[float] = []
    latencies: list[float] = []
    lags: list[float] = []
    errors = 0

    async def one(due: float) -> None:
        nonlocal errors
        sent = clock()
        lags.append(sent - due)
        try:
            conn = free.pop() if free else None
            if conn is None:
                _, conn = await loop.create_connection(Connection, HOST, port)
                opened.append(conn)
            status = await conn.send(request)
        except OSError:
            status = 0
        if status == 200:
            sends.append(sent)
            latencies.append(clock() - sent)
        else:
            errors += 1
        if conn is not None and not conn.closed:
            free.append(conn)

    total = int(rate * seconds)
    tasks: list[asyncio.Task[None]] = []
    start = clock() + 0.05
    i = 0
    while i < total:
        now = clock()
        # Everything due by now goes out at once: the loop's timers are millisecond-coarse.
        while i < total and start + i / rate <= now:
            tasks.append(asyncio.create_task(one(start + i / rate)))
            i += 1
        if i < total:
            await asyncio.sleep(max(0.0, start + i / rate - clock()))
    await asyncio.gather(*tasks)
    for conn in opened:
        if conn.transport is not None:
            conn.transport.close()
    return {
        "requests": total,
        "errors": errors,
        "p50_ms": _ms(percentile(latencies, 0.5)) if latencies else None,
        "p99_ms": _ms(percentile(latencies, 0.99)) if latencies else None,
        "send_lag_p99_ms": _ms(percentile(lags, 0.99)),
        "connections": len(opened),
        **({"raw": list(zip(sends, latencies, strict=True))} if raw else {}),
    }


async def python_closed_loop(
    port: int, bodies: Sequence[bytes], connections: int, seconds: float
) -> dict[str, Any]:
    """The fallback when wrk is missing: ``connections`` clients back to back, sending ``bodies`` in
    turn (the client's own CPU then caps what it can measure)."""
    loop = asyncio.get_running_loop()
    requests = itertools.cycle([http_request(port, body) for body in bodies])
    done = errors = 0
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal done, errors
        _, conn = await loop.create_connection(Connection, HOST, port)
        while time.perf_counter() < deadline and not conn.closed:
            if await conn.send(next(requests)) == 200:
                done += 1
            else:
                errors += 1
        if conn.transport is not None:
            conn.transport.close()

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(connections)))
    wall = time.perf_counter() - began
    return {"requests": done + errors, "errors": errors, "per_s": round(done / wall), "client": "python"}


class StreamConnection(asyncio.Protocol):
    """One keep-alive connection receiving streamed (SSE, chunked) completions one at a time: when
    each event arrived. Events that come in one read arrive together (their gap is 0)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._head = True
        self._tail = b""
        self._status = 0
        self._left = -1  # body bytes still due of a response with a Content-Length
        self._done: asyncio.Future[int] | None = None
        self.arrivals: list[float] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._done is not None and not self._done.done():
            self._done.set_result(0)

    def send(self, request: bytes) -> asyncio.Future[int]:
        """The status once the whole stream has arrived (0 if the connection broke)."""
        assert self.transport is not None
        self._done = asyncio.get_running_loop().create_future()
        self._head, self._tail, self._status, self._left = True, b"", 0, -1
        self.arrivals = []
        self.transport.write(request)
        return self._done

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self._done is None or self._done.done():
            return
        if self._head:
            data = self._tail + data
            end = data.find(b"\r\n\r\n")
            if end < 0:
                self._tail = data
                return
            status = _STATUS.match(data)
            self._status = int(status[1]) if status else 0
            length = _LENGTH.search(data[:end])
            self._head, self._tail = False, b""
            self._left = int(length[1]) if length else -1
            data = data[end + 4 :]
        if self._left >= 0:  # not a stream (an error, say): its Content-Length says when it ends
            self._left -= len(data)
            if self._left <= 0:
                self._done.set_result(self._status or 1)
            return
        # An event is a "data: " line; a count per read is enough (an event split over two reads
        # counts where its start arrived).
        self.arrivals += [now] * data.count(b"data: ")
        tail = (self._tail + data)[-7:]
        self._tail = tail
        if tail.endswith(b"0\r\n\r\n"):
            self._done.set_result(self._status)


def _gaps(arrivals: Sequence[float], sent: float) -> tuple[float, list[float]]:
    """Time to the first event, and the gaps between the events after it."""
    tokens = arrivals
    return arrivals[0] - sent, [b - a for a, b in itertools.pairwise(tokens)]


async def streamed_load(port: int, body: bytes, connections: int, seconds: float) -> dict[str, Any]:
    """``connections`` clients, each sending streamed completions back to back for ``seconds``: how
    many, their events, time to first event and inter-token gaps (p50 / p99)."""
    loop = asyncio.get_running_loop()
    request = http_request(port, body)
    done = errors = events = 0
    first: list[float] = []
    gaps: list[float] = []
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal done, errors, events
        _, conn = await loop.create_connection(StreamConnection, HOST, port)
        while time.perf_counter() < deadline and not conn.closed:
            sent = time.perf_counter()
            try:
                async with asyncio.timeout(STREAM_TOKENS * STREAM_ITL_S * 20):  # a bench must not hang
                    status = await conn.send(request)
            except TimeoutError:
                status = 0
            if status != 200 or not conn.arrivals:
                errors += 1
                if status == 0 or errors > 1000:
                    break
                continue
            done += 1
            events += len(conn.arrivals)
            ttft, between = _gaps(conn.arrivals, sent)
            first.append(ttft)
            gaps.extend(between)
        if conn.transport is not None:
            conn.transport.close()

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(connections)))
    wall = time.perf_counter() - began
    return {
        "requests": done + errors,
        "errors": errors,
        "per_s": round(done / wall, 1),
        "events_per_request": round(events / max(1, done), 1),
        "ttft_p50_ms": _ms(percentile(first, 0.5)) if first else None,
        "ttft_p99_ms": _ms(percentile(first, 0.99)) if first else None,
        "itl_p50_ms": _ms(percentile(gaps, 0.5)) if gaps else None,
        "itl_p99_ms": _ms(percentile(gaps, 0.99)) if gaps else None,
    }


_WRK_SCRIPT = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [==[%s]==]
"""
# wrk's own percentiles take the rank round(p·n + 0.5), not the benches' rule: its done() prints the
# totals and every latency it recorded (µs, with its count), and the figures are taken here.
WRK_DONE = """done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRK %d %d %d %d %d %d %d\\n", summary.requests, summary.duration,
    e.status, e.connect, e.read, e.write, e.timeout))
  for i = 1, #latency do
    local value, count = latency(i)
    io.write(string.format("LATENCY %d %d\\n", value, count))
  end
end
"""


def wrk_figures(output: str) -> dict[str, Any] | None:
    """What a wrk run with :data:`WRK_DONE` printed: requests, per second, errors, p50 and p99 ms (by
    the benches' rule over the latencies wrk recorded); ``None`` without its totals line."""
    totals = None
    latencies: list[int] = []
    for line in output.splitlines():
        if line.startswith("WRK "):
            totals = [int(x) for x in line.split()[1:]]
        elif line.startswith("LATENCY "):
            value, count = (int(x) for x in line.split()[1:])
            latencies += [value] * count
    if totals is None:
        return None
    requests, micros, non2xx, *socket_errors = totals
    return {
        "requests": requests,
        "errors": non2xx + sum(socket_errors),
        "per_s": round(requests / (micros / 1e6)),
        "p50_ms": round(percentile(latencies, 0.5) / 1000, 3) if latencies else None,
        "p99_ms": round(percentile(latencies, 0.99) / 1000, 3) if latencies else None,
    }


class Load:
    """Closed-loop load: wrk when installed, else the Python client."""

    def __init__(self, run_dir: Path, connections: int) -> None:
        self.wrk = shutil.which("wrk")
        self.connections = connections
        self._scripts: dict[bytes, Path] = {}
        self._run_dir = run_dir

    def closed_loop(self, port: int, body: bytes, seconds: float) -> dict[str, Any]:
        if self.wrk is None:
            return aio.run(python_closed_loop(port, [body], self.connections, seconds))
        if body not in self._scripts:
            path = self._run_dir / f"wrk-{len(self._scripts)}.lua"
            path.write_text(_WRK_SCRIPT % body.decode() + WRK_DONE, encoding="utf-8")
            self._scripts[body] = path
        argv = [self.wrk, "-t1", f"-c{self.connections}", f"-d{seconds:g}s", "-s", str(self._scripts[body])]
        argv.append(f"http://{HOST}:{port}{PATH}")
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert child.stdout is not None
        output = child.stdout.read().decode()
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        figures = wrk_figures(output)
        if child.returncode != 0 or figures is None:
            raise RuntimeError(f"wrk failed ({child.returncode}):\n{output}")
        return figures | {"client": "wrk", "wrk_cpu_s": usage.ru_utime + usage.ru_stime}


# -- the runs -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setup:
    """One way Envoy shows requests (and responses) to the picker."""

    name: str
    what: str
    responses: bool
    body_mode: str | None = None  # None: the bootstrap's default with or without responses
    response_body: str = envoy.ACCESS_LOG
    body_without_waiting: bool = False

    def bootstrap(self, pickers: Sequence[int]) -> tuple[dict[str, Any], int]:
        return front_bootstrap(
            pickers,
            responses=self.responses,
            body_mode=self.body_mode,
            response_body=self.response_body,
            body_without_waiting=self.body_without_waiting,
        )


SHIPPED = Setup(
    "shipped",
    "request headers SEND + body BUFFERED, response headers SEND + body NONE, trailers SKIP, the Lua "
    "usage filter (deploy/envoy/usage.lua) and Envoy's gRPC access log to the picker (response sizes and "
    "usage tokens, batched every 0.5 s): what every shipped bootstrap (deploy/envoy, the standalone-envoy "
    "overlay, the local stack) configures",
    responses=True,
)
STREAMED = Setup(
    "streamed",
    "request headers SEND + body BUFFERED, response headers SEND + body STREAMED, trailers SKIP, "
    "allow_mode_override (EnvoyOptions(response_body='streamed'), the default before the access log; "
    "the Envoy Gateway policy asks the same without the override): the picker sees every chunk of a "
    "response whose request asked for usage",
    responses=True,
    response_body=envoy.RESPONSE_STREAMED,
)
SETUPS = (
    SHIPPED,
    STREAMED,
    Setup(
        "headers_only",
        "as shipped, but without the Lua filter and the access log (EnvoyOptions(response_body='none')): "
        "the picker sees a response's headers, and its end when Envoy closes the stream; no usage "
        "tokens, no response size",
        responses=True,
        response_body=envoy.NO_BODY,
    ),
    Setup(
        "requests_only",
        "request headers SEND + body FULL_DUPLEX_STREAMED, no response processing (the stream ends once "
        "routed)",
        responses=False,
    ),
    Setup(
        "buffered",
        "request headers SEND + body BUFFERED, no response processing",
        responses=False,
        body_mode=envoy.BUFFERED,
    ),
    Setup(
        "early_body",
        "as shipped, but the request body STREAMED and sent without waiting for the header answer "
        "(send_body_without_waiting_for_header_response; EnvoyOptions(request_body_mode=STREAMED, "
        "body_without_waiting=True)): the picker holds that answer, with the route, until the body is in",
        responses=True,
        body_mode=envoy.STREAMED,
        body_without_waiting=True,
    ),
)
# The streamed workload: a chat UI's requests, every token an SSE event (and an ext_proc message when
# the picker sees response bodies).
STREAM_TOKENS = 200
STREAM_ITL_S = 0.01


def streamed_body(model: str, *, usage: bool = True) -> bytes:
    doc: dict[str, Any] = {"model": model, "prompt": "Summarize: points.", "max_tokens": STREAM_TOKENS}
    doc["stream"] = True
    if usage:
        doc["stream_options"] = {"include_usage": True}
    return json.dumps(doc).encode()


@dataclass
class Bench:
    run_dir: Path
    load: Load
    rate: float
    seconds: float
    backend: ManagedProcess
    stream_connections: int = 40

    def closed(self, port: int, body: bytes, meter: Meter) -> dict[str, Any]:
        self.load.closed_loop(port, body, 1.0)  # warm-up: connections, caches, the picker's first streams
        calibration = calibration_ms()
        with meter.run() as usage:
            result = self.load.closed_loop(port, body, self.seconds)
        if "wrk_cpu_s" in result:
            usage.seconds["wrk"] = result.pop("wrk_cpu_s")
        return result | usage.report(result["requests"]) | {"calibration_ms": calibration}

    def fixed(self, port: int, body: bytes, meter: Meter) -> dict[str, Any]:
        calibration = calibration_ms()
        with meter.run() as usage, no_gc():
            result: dict[str, Any] = aio.run(fixed_rate(port, body, self.rate, self.seconds))
        return result | usage.report(result["requests"]) | {"calibration_ms": calibration}

    def streamed(self, port: int, body: bytes, meter: Meter) -> dict[str, Any]:
        """The streamed workload for ``seconds`` (at least 4 streams' length), CPU per request and
        per event."""
        seconds = max(self.seconds, 4 * STREAM_TOKENS * STREAM_ITL_S)
        calibration = calibration_ms()
        with meter.run() as usage:
            result: dict[str, Any] = aio.run(streamed_load(port, body, self.stream_connections, seconds))
        report = usage.report(result["requests"])
        events = max(1, result["events_per_request"] * result["requests"])
        report["cpu_us_per_event"] = {n: round(s / events * 1e6, 2) for n, s in usage.seconds.items()}
        return result | report | {"calibration_ms": calibration}

    def envoy_alone(self, pods: Sequence[int]) -> dict[str, Any]:
        doc, port = alone_bootstrap(pods)
        alone = start_envoy(doc, "envoy-alone", self.run_dir)
        try:
            wait_completion(alone, port, PLAIN)
            meter = Meter({"envoy": alone.pid, "backend": self.backend.pid})
            return {
                "closed_loop": self.closed(port, PLAIN, meter),
                "fixed_rate": self.fixed(port, PLAIN, meter),
            }
        finally:
            alone.stop(5)

    def pickers(self, stack: Pickers, server: str) -> dict[str, Any]:
        first, first_port = stack.start_picker(f"picker-{server}", server)
        second, second_port = stack.start_picker(f"picker-{server}-2", server)
        try:
            out: dict[str, Any] = {}
            for setup in SETUPS:
                doc, port = setup.bootstrap([first_port])
                proxy = start_envoy(doc, f"envoy-{server}-{setup.name}", self.run_dir)
                try:
                    wait_completion(proxy, port, REWRITTEN)
                    # The second picker idles meanwhile: its CPU is what a picker spends without
                    # traffic (snapshots, config polls), to tell apart from the per-request cost.
                    pids = {"picker": first.pid, "envoy": proxy.pid, "backend": self.backend.pid}
                    meter = Meter({**pids, "idle_picker": second.pid, "collector": stack.collector.pid})
                    out[setup.name] = {
                        "closed_loop": self.closed(port, REWRITTEN, meter),
                        "fixed_rate": self.fixed(port, REWRITTEN, meter),
                    }
                finally:
                    proxy.stop(5)
            doc, port = SHIPPED.bootstrap([first_port, second_port])
            proxy = start_envoy(doc, f"envoy-{server}-two", self.run_dir)
            try:
                wait_completion(proxy, port, REWRITTEN)
                meter = Meter({"picker": first.pid, "picker_2": second.pid, "envoy": proxy.pid})
                out["two_processes"] = {"closed_loop": self.closed(port, REWRITTEN, meter)}
            finally:
                proxy.stop(5)
            return out
        finally:
            stack.stop_picker(second)
            stack.stop_picker(first)

    def streams(
        self, stack: Pickers, pods: ManagedProcess, ports: Sequence[int], server: str
    ) -> dict[str, Any]:
        """The streamed workload straight to the pods, through Envoy alone, and through Envoy and a
        picker in each setup."""
        plain, rewritten = streamed_body(PLAIN_MODEL), streamed_body(REWRITTEN_MODEL)
        out: dict[str, Any] = {}
        # Straight to the pods: each connection to one of them, in turn.
        direct = itertools.cycle(ports)
        meter = Meter({"backend": pods.pid})
        out["direct"] = self.streamed_direct(direct, plain, meter)
        doc, port = alone_bootstrap(ports)
        alone = start_envoy(doc, "envoy-alone-streams", self.run_dir)
        try:
            wait_completion(alone, port, PLAIN)
            out["envoy_alone"] = self.streamed(port, plain, Meter({"envoy": alone.pid, "backend": pods.pid}))
        finally:
            alone.stop(5)
        # What the Lua filter costs Envoy per chunk: Envoy alone with it.
        doc, port = alone_bootstrap(ports, lua=True)
        alone = start_envoy(doc, "envoy-alone-lua-streams", self.run_dir)
        try:
            wait_completion(alone, port, PLAIN)
            meter = Meter({"envoy": alone.pid, "backend": pods.pid})
            out["envoy_alone_lua"] = self.streamed(port, plain, meter)
        finally:
            alone.stop(5)
        picker, picker_port = stack.start_picker(f"picker-{server}-streams", server)
        try:
            for setup in SETUPS[:4]:
                doc, port = setup.bootstrap([picker_port])
                proxy = start_envoy(doc, f"envoy-{server}-{setup.name}-streams", self.run_dir)
                try:
                    wait_completion(proxy, port, REWRITTEN)
                    meter = Meter({"picker": picker.pid, "envoy": proxy.pid, "backend": pods.pid})
                    out[setup.name] = self.streamed(port, rewritten, meter)
                    if setup is SHIPPED or setup is STREAMED:
                        # Usage not asked for (STREAMED: the picker turns the body off at the headers).
                        no_usage = streamed_body(REWRITTEN_MODEL, usage=False)
                        out[f"{setup.name}_no_usage"] = self.streamed(port, no_usage, meter)
                finally:
                    proxy.stop(5)
        finally:
            stack.stop_picker(picker)
        return out

    def streamed_direct(self, ports: Iterator[int], body: bytes, meter: Meter) -> dict[str, Any]:
        # One client per connection as through a proxy, but each to a pod of its own turn.
        seconds = max(self.seconds, 4 * STREAM_TOKENS * STREAM_ITL_S)
        per_pod: dict[int, int] = {}
        for _ in range(self.stream_connections):
            port = next(ports)
            per_pod[port] = per_pod.get(port, 0) + 1

        async def all_pods() -> list[dict[str, Any]]:
            return await asyncio.gather(*(streamed_load(p, body, n, seconds) for p, n in per_pod.items()))

        calibration = calibration_ms()
        with meter.run() as usage:
            parts = aio.run(all_pods())
        # The pods' percentiles are pooled by weight of their requests: close enough for a reference.
        requests = sum(p["requests"] for p in parts)
        merged: dict[str, Any] = {
            "requests": requests,
            "errors": sum(p["errors"] for p in parts),
            "per_s": round(sum(p["per_s"] for p in parts), 1),
            "events_per_request": parts[0]["events_per_request"],
        }
        for key in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"):
            values = [p[key] for p in parts if p[key] is not None]
            merged[key] = max(values) if key.endswith("p99_ms") else sorted(values)[len(values) // 2]
        return merged | usage.report(requests) | {"calibration_ms": calibration}

    # -- the headline's latency: Envoy alone and the shipped mode in turns ------------------------
    def paired(self, stack: Pickers, pods: Sequence[int], server: str, rounds: int) -> dict[str, Any]:
        """Envoy alone and one picker in the shipped mode, ``rounds`` fixed-rate runs each, taken in
        turns (the order reversed every other round): what the picker adds, per round and the median
        of the rounds. A single p99 over 2,500 requests on a shared machine moves by a millisecond from
        one run to the next; rounds side by side see the machine alike."""
        picker, ext_proc = stack.start_picker(f"picker-{server}-paired", server)
        doc, alone_port = alone_bootstrap(pods)
        alone = start_envoy(doc, "envoy-alone-paired", self.run_dir)
        doc, shipped_port = SHIPPED.bootstrap([ext_proc])
        shipped = start_envoy(doc, f"envoy-{server}-paired", self.run_dir)
        try:
            wait_completion(alone, alone_port, PLAIN)
            wait_completion(shipped, shipped_port, REWRITTEN)
            targets = {
                "alone": (alone_port, PLAIN, Meter({"envoy": alone.pid, "backend": self.backend.pid})),
                SHIPPED.name: (
                    shipped_port,
                    REWRITTEN,
                    Meter({"picker": picker.pid, "envoy": shipped.pid, "backend": self.backend.pid}),
                ),
            }
            for port, body, _ in targets.values():  # warm-up: connections, the first streams
                aio.run(fixed_rate(port, body, self.rate, 1.0))
            runs: list[dict[str, Any]] = []
            for r in range(rounds):
                order = list(targets) if r % 2 == 0 else list(targets)[::-1]
                runs.append({name: self.fixed(*targets[name]) for name in order})
        finally:
            shipped.stop(5)
            alone.stop(5)
            stack.stop_picker(picker)
        added = [
            {
                key: round(run[SHIPPED.name][f"{key}_ms"] - run["alone"][f"{key}_ms"], 3)
                for key in ("p50", "p99")
            }
            for run in runs
        ]

        return {
            "what": (
                f"picker.server={server}; Envoy alone and the shipped mode, {rounds} runs of "
                f"{self.seconds:g} s at {self.rate:g} req/s each, in turns (order reversed every other "
                "round); added = shipped - alone within a round; the headline is the median of the rounds"
            ),
            "rounds": rounds,
            "added_p50_ms": round(statistics.median(a["p50"] for a in added), 3),
            "added_p99_ms": round(statistics.median(a["p99"] for a in added), 3),
            "added": added,
            "runs": runs,
        }

    # -- tracing: the same picker with tracing off and on, side by side ----------------------------
    def tracing(self, stack: Pickers, server: str, rounds: int = 2) -> dict[str, Any]:
        """Off and on (every request sampled, exported over OTLP/gRPC to a receiver in a process of its
        own) in turns, ``rounds`` times: Envoy sending requests only, closed loop and fixed rate."""
        receiver = subprocess.Popen(
            [sys.executable, "-m", "pointsman_testkit.otlp"], stdout=subprocess.PIPE, text=True
        )
        try:
            assert receiver.stdout is not None
            grpc_port = int(receiver.stdout.readline().split()[1])
            on = {"enabled": True, "endpoint": f"http://{HOST}:{grpc_port}", "sampler": "always_on"}
            runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
            for _ in range(rounds):
                for mode, section in (("off", None), ("on", on)):
                    runs[mode].append(self._traced_run(stack, server, mode, section))
        finally:
            receiver.terminate()
            out, _ = receiver.communicate(timeout=30)
        spans = int(out.split()[-1]) if out.strip() else 0

        def median(mode: str, run: str, *keys: str) -> float:
            values = []
            for entry in runs[mode]:
                value: Any = entry[run]
                for key in keys:
                    value = value[key]
                values.append(float(value))
            return sorted(values)[len(values) // 2]

        summary = {
            mode: {
                "cpu_us_per_decision": median(mode, "closed_loop", "cpu_us_per_request", "picker"),
                "max_decisions_per_s": median(mode, "closed_loop", "per_s"),
                "p50_ms": median(mode, "fixed_rate", "p50_ms"),
                "p99_ms": median(mode, "fixed_rate", "p99_ms"),
                "fixed_rate_cpu_us_per_decision": median(mode, "fixed_rate", "cpu_us_per_request", "picker"),
            }
            for mode in runs
        }
        return {
            "what": (
                f"picker.server={server}, requests only; tracing off, then on at ratio 1 (always_on, "
                f"OTLP/gRPC to a receiver process), {rounds} rounds in turn; the upper median of the rounds"
            ),
            "summary": summary,
            "spans_received": spans,
            "runs": runs,
            "busy_runs": busy_runs({f"{m}_{i}": r for m, rs in runs.items() for i, r in enumerate(rs)}),
        }

    def _traced_run(
        self, stack: Pickers, server: str, mode: str, section: dict[str, Any] | None
    ) -> dict[str, Any]:
        picker, port = stack.start_picker(f"picker-tracing-{mode}", server, tracing=section)
        # Envoy traces too, as it would in front of a tracing picker.
        tracing = envoy.EnvoyTracing(section["endpoint"]) if section is not None else None
        doc, gateway = front_bootstrap([port], responses=False, tracing=tracing)
        proxy = start_envoy(doc, f"envoy-tracing-{mode}", self.run_dir)
        try:
            wait_completion(proxy, gateway, REWRITTEN)
            meter = Meter({"picker": picker.pid, "envoy": proxy.pid, "backend": self.backend.pid})
            return {
                "closed_loop": self.closed(gateway, REWRITTEN, meter),
                "fixed_rate": self.fixed(gateway, REWRITTEN, meter),
            }
        finally:
            proxy.stop(5)
            stack.stop_picker(picker)

    def vllm_router(self, pods: Sequence[int], policy: str) -> dict[str, Any] | None:
        if not ROUTER.is_file():
            return None
        port = free_port()
        argv = [str(ROUTER), "--host", HOST, "--port", str(port), "--policy", policy, "--worker-urls"]
        argv += [f"http://{HOST}:{p}" for p in pods]
        # Its default logs a line per request, which the output pump would pay for.
        argv += ["--prometheus-port", str(free_port()), "--log-level", "warning"]
        log_path = self.run_dir / f"vllm-router-{policy}.log"
        router = ManagedProcess("vllm-router", argv, env=dict(os.environ), log_path=log_path)
        try:
            wait_completion(router, port, PLAIN, timeout=60)
            meter = Meter({"router": router.pid, "backend": self.backend.pid})
            out = {"fixed_rate": self.fixed(port, PLAIN, meter)}
            if policy == "round_robin":
                out["closed_loop"] = self.closed(port, PLAIN, meter)
            return out
        finally:
            router.stop(5)


def start_sse_pods(ports: Sequence[int], run_dir: Path) -> ManagedProcess:
    argv = [sys.executable, str(ROOT / "bench" / "sse_pod.py"), "--ports", ",".join(map(str, ports))]
    argv += ["--metrics", str(METRICS_PAGE), "--itl", str(STREAM_ITL_S)]
    pods = ManagedProcess("sse-pods", argv, env=dict(os.environ), log_path=run_dir / "sse-pods.log")
    wait_completion(pods, ports[0], PLAIN)
    return pods


BUSY_CORES = 0.25


def busy_runs(tree: dict[str, Any], path: str = "") -> list[str]:
    """``path (cores)`` of every run in ``tree`` during which the rest of the machine was busy."""
    found: list[str] = []
    for key, value in tree.items():
        if not isinstance(value, dict):
            continue
        here = f"{path}.{key}" if path else key
        rest = value.get("cores", {}).get("rest_of_machine")
        if rest is not None and rest > BUSY_CORES:
            found.append(f"{here} ({rest} cores)")
        found += busy_runs(value, here)
    return found


def headline(head: dict[str, Any], paired: dict[str, Any], streams: dict[str, Any] | None) -> dict[str, Any]:
    """The top-level figures: the shipped mode's, against Envoy alone (latency: the paired rounds')."""
    shipped = head[SHIPPED.name]
    runs = paired["runs"]

    def middle(name: str, key: str) -> float:
        values = sorted(float(run[name][key]) for run in runs)
        return values[len(values) // 2]

    out: dict[str, Any] = {
        "cpu_us_per_request": shipped["closed_loop"]["cpu_us_per_request"]["picker"],
        "max_requests_per_s": shipped["closed_loop"]["per_s"],
        "envoy_p50_ms": middle("alone", "p50_ms"),
        "envoy_p99_ms": middle("alone", "p99_ms"),
        "picker_p50_ms": middle(SHIPPED.name, "p50_ms"),
        "picker_p99_ms": middle(SHIPPED.name, "p99_ms"),
        "added_p50_ms": paired["added_p50_ms"],
        "added_p99_ms": paired["added_p99_ms"],
        "latency_rounds": paired["rounds"],
    }
    if streams is not None:
        out["streamed"] = streamed_headline(streams)
    return out


def streamed_headline(streams: dict[str, Any]) -> dict[str, Any]:
    """The top-level figures of the streamed workload (one server's runs), in the shipped mode."""
    run = streams[SHIPPED.name]
    unstreamed = streams["requests_only"]
    return {
        "cpu_us_per_request": run["cpu_us_per_request"]["picker"],
        "cpu_us_per_event": run["cpu_us_per_event"]["picker"],
        "cpu_us_per_request_unseen_responses": unstreamed["cpu_us_per_request"]["picker"],
        "no_usage_cpu_us_per_request": streams["shipped_no_usage"]["cpu_us_per_request"]["picker"],
        "no_usage_cpu_us_per_event": streams["shipped_no_usage"]["cpu_us_per_event"]["picker"],
        "streamed_cpu_us_per_event": streams[STREAMED.name]["cpu_us_per_event"]["picker"],
        "envoy_cpu_us_per_event": run["cpu_us_per_event"]["envoy"],
        "envoy_alone_cpu_us_per_event": streams["envoy_alone"]["cpu_us_per_event"]["envoy"],
        "lua_adds_envoy_cpu_us_per_event": round(
            streams["envoy_alone_lua"]["cpu_us_per_event"]["envoy"]
            - streams["envoy_alone"]["cpu_us_per_event"]["envoy"],
            2,
        ),
        "itl_p50_ms": run["itl_p50_ms"],
        "itl_p99_ms": run["itl_p99_ms"],
        "direct_itl_p50_ms": streams["direct"]["itl_p50_ms"],
        "direct_itl_p99_ms": streams["direct"]["itl_p99_ms"],
    }


def _cell(value: Any, unit: str = "") -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value >= 100:
        value = round(value)
    text = f"{value:,}" if isinstance(value, int) else f"{value}"
    return text + unit


def _load_text(load: dict[str, list[float]] | None) -> str:
    if not load:
        return ""
    start, end = (" / ".join(f"{x:g}" for x in load[k]) for k in ("start", "end"))
    return f", load average (1 / 5 / 15 min) {start} at the start, {end} at the end"


def markdown(result: dict[str, Any]) -> str:
    """bench/results/picker.md: the tables docs/picker.md points at, written by the run itself."""
    detail = result["detail"]
    alone = detail["envoy_alone"]
    lines = [
        "# `make bench-picker`: the latest run",
        "",
        f"Written by `bench/picker.py` ({result['bench_seconds']} s, {result['seconds_per_run']} s per run, "
        f"{result['machine']['cpus']} CPUs, Python {result['machine']['python']}"
        + _load_text(result["machine"].get("load_average"))
        + "); every figure is in `picker.json`. Headline: the shipped mode ("
        + SHIPPED.what
        + f"), `picker.server: {result['server']}`.",
        "",
        "| | this run | target |",
        "|---|---|---|",
        "| picker CPU per request (shipped mode, closed loop) | "
        f"{_cell(result['cpu_us_per_request'], ' µs')} | |",
        f"| at {result['rate']:g} req/s, p50 / p99 (the rounds' medians): Envoy + picker; Envoy alone | "
        f"{result['picker_p50_ms']} / {result['picker_p99_ms']} ms; "
        f"{result['envoy_p50_ms']} / {result['envoy_p99_ms']} ms | |",
        f"| added by the picker at {result['rate']:g} req/s, p50 / p99 (median of "
        f"{result['latency_rounds']} rounds in turn, below) | "
        f"+{result['added_p50_ms']} / +{result['added_p99_ms']} ms | + ≤ 1 ms / + ≤ 2.5 ms |",
    ]
    streamed = result.get("streamed")
    if streamed is not None:
        lines += [
            f"| streamed ({STREAM_TOKENS} tokens, SSE, usage asked): picker CPU per request; per event | "
            f"{_cell(streamed['cpu_us_per_request'], ' µs')}; {_cell(streamed['cpu_us_per_event'], ' µs')} | "
            "per event ≤ 5 µs |",
            "| streamed, usage not asked: picker CPU per request; per event | "
            f"{_cell(streamed['no_usage_cpu_us_per_request'], ' µs')}; "
            f"{_cell(streamed['no_usage_cpu_us_per_event'], ' µs')} | per event ≤ 5 µs |",
            "| streamed, usage asked, every chunk to the picker (`streamed`): picker CPU per event | "
            f"{_cell(streamed.get('streamed_cpu_us_per_event'), ' µs')} | |",
            "| streamed: Envoy CPU per event, shipped; Envoy alone; added by the Lua filter to Envoy alone | "
            f"{_cell(streamed.get('envoy_cpu_us_per_event'), ' µs')}; "
            f"{_cell(streamed.get('envoy_alone_cpu_us_per_event'), ' µs')}; "
            f"{_cell(streamed.get('lua_adds_envoy_cpu_us_per_event'), ' µs')} | |",
            f"| streamed: inter-token p50 / p99 through Envoy + picker; straight to a pod | "
            f"{streamed['itl_p50_ms']} / {streamed['itl_p99_ms']} ms; "
            f"{streamed['direct_itl_p50_ms']} / {streamed['direct_itl_p99_ms']} ms | |",
        ]
    lines += [
        "| #423 tree over 512 pods, in-process (`decision_us_512_pods`) | "
        f"{result['decision_us_512_pods']} µs | < 50 µs |",
    ]
    paired = detail.get("paired")
    if paired is not None:
        lines += [
            "",
            f"The headline's latency ({paired['what']}), p50 / p99 ms:",
            "",
            "| round | Envoy alone | shipped | added |",
            "|---|---|---|---|",
        ]
        for i, (run, added) in enumerate(zip(paired["runs"], paired["added"], strict=True), 1):
            alone_run, shipped_run = run["alone"], run[SHIPPED.name]
            lines.append(
                f"| {i} | {alone_run['p50_ms']} / {alone_run['p99_ms']} | "
                f"{shipped_run['p50_ms']} / {shipped_run['p99_ms']} | +{added['p50']} / +{added['p99']} |"
            )
    lines += [
        "",
        "One-token requests (picker CPU under the closed loop, wrk; latency from the open-loop client):",
        "",
        "| setup | closed loop | picker CPU per request | "
        f"{result['rate']:g} req/s p50 / p99 | `calibration_ms` |",
        "|---|---|---|---|---|",
        f"| Envoy alone | {_cell(alone['closed_loop']['per_s'], ' req/s')} | "
        f"(Envoy: {_cell(alone['closed_loop']['cpu_us_per_request']['envoy'], ' µs')}) | "
        f"{alone['fixed_rate']['p50_ms']} / {alone['fixed_rate']['p99_ms']} ms | "
        f"{alone['closed_loop']['calibration_ms']} |",
    ]
    for server, setups in detail["servers"].items():
        for name, run in setups.items():
            closed, fixed = run["closed_loop"], run.get("fixed_rate")
            cpu = closed["cpu_us_per_request"]
            picker_cpu = _cell(cpu["picker"], " µs")
            if "picker_2" in cpu:
                picker_cpu += " + " + _cell(cpu["picker_2"], " µs")
            latency = f"{fixed['p50_ms']} / {fixed['p99_ms']} ms" if fixed else ""
            lines.append(
                f"| {server}, {name} | {_cell(closed['per_s'], ' req/s')} | {picker_cpu} | {latency} | "
                f"{closed['calibration_ms']} |"
            )
    for policy, run in detail["vllm_router"].items():
        if run is None:
            continue
        closed = run.get("closed_loop")
        fixed = run["fixed_rate"]
        lines.append(
            f"| vllm-router, {policy} | {_cell(closed['per_s'], ' req/s') if closed else ''} | "
            f"{'(router: ' + _cell(closed['cpu_us_per_request']['router'], ' µs') + ')' if closed else ''} | "
            f"{fixed['p50_ms']} / {fixed['p99_ms']} ms | {closed['calibration_ms'] if closed else ''} |"
        )
    streams = detail.get("streams")
    if streams:
        lines += [
            "",
            f"Streamed completions ({detail['what']['streamed']}):",
            "",
            "| setup | req/s | picker CPU per request; per event | Envoy CPU per event | TTFT p50 / p99 | "
            "inter-token p50 / p99 | `calibration_ms` |",
            "|---|---|---|---|---|---|---|",
        ]
        for server, setups in streams.items():
            for name, run in setups.items():
                cpu = run["cpu_us_per_request"].get("picker")
                per_event = run.get("cpu_us_per_event", {}).get("picker")
                picker_cpu = f"{_cell(cpu, ' µs')}; {_cell(per_event, ' µs')}" if cpu is not None else ""
                envoy_cpu = _cell(run.get("cpu_us_per_event", {}).get("envoy"), " µs")
                lines.append(
                    f"| {server}, {name} | {run['per_s']} | {picker_cpu} | {envoy_cpu} | "
                    f"{run['ttft_p50_ms']} / {run['ttft_p99_ms']} ms | "
                    f"{run['itl_p50_ms']} / {run['itl_p99_ms']} ms | {run['calibration_ms']} |"
                )
    if detail.get("prefix"):
        from picker_prefix import prefix_markdown  # it imports this module

        lines += prefix_markdown(detail["prefix"])
    lines += ["", "Setups:", ""]
    lines += [f"- `{s.name}`: {s.what}" for s in SETUPS]
    lines += ["- `two_processes`: shipped, two picker processes as two endpoints of the ext_proc cluster"]
    busy = detail["busy_runs"]
    lines += [
        "",
        "Runs the rest of the machine disturbed (more than "
        f"{BUSY_CORES} core): {', '.join(busy) if busy else 'none'}.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=500.0, help="req/s of the latency runs")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each measured run")
    parser.add_argument("--connections", type=int, default=16, help="wrk's connections")
    parser.add_argument("--stream-connections", type=int, default=40, help="concurrent streamed completions")
    parser.add_argument("--pods", type=int, default=3, help="backend pods (listeners)")
    parser.add_argument(
        "--latency-rounds",
        type=int,
        default=5,
        help="rounds of Envoy alone and the shipped mode in turn, for the headline's added latency",
    )
    parser.add_argument("--servers", default=",".join(SERVERS), help="picker.server values to run")
    parser.add_argument("--no-streams", action="store_true", help="skip the streamed workload")
    parser.add_argument(
        "--against",
        type=Path,
        help="another checkout (the code before a change): its picker package runs beside this tree's, "
        "as SERVER@before, in the same run",
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--only-tracing",
        action="store_true",
        help="only the tracing off/on runs, into detail.tracing of the existing --output",
    )
    parser.add_argument(
        "--only-streams",
        action="store_true",
        help="only the streamed workload (every --servers, with --against's beside), into detail.streams "
        "and the top-level streamed figures of the existing --output",
    )
    parser.add_argument(
        "--only-prefix",
        action="store_true",
        help="only the 4 KB-prompt runs with and without prefix scoring, into detail.prefix of the "
        "existing --output (bench/picker_prefix.py)",
    )
    args = parser.parse_args()
    servers = [s for s in args.servers.split(",") if s]
    unknown = set(servers) - set(SERVERS)
    if not servers or unknown:
        parser.error(f"--servers: choose from {', '.join(SERVERS)}")
    default_server = PickerConfig().server
    headline_server = default_server if default_server in servers else servers[0]
    if args.against is not None:
        # Each before beside its after, so both see the machine alike.
        servers = [label for server in servers for label in (server, f"{server}@before")]

    began = time.perf_counter()
    load_at_start = [round(x, 2) for x in os.getloadavg()]  # the machine's load is the figures' context
    schedule = bench_schedule()
    director = bench_director()
    run_dir = Path(tempfile.mkdtemp(prefix="bench-picker-"))
    pods = [free_port() for _ in range(args.pods)]
    backend = start_envoy(backend_bootstrap(pods, free_port()), "backend", run_dir)
    load = Load(run_dir, args.connections)
    bench = Bench(run_dir, load, args.rate, args.seconds, backend, args.stream_connections)
    by_server: dict[str, Any] = {}
    streams: dict[str, Any] = {}
    if args.only_tracing:
        return only_tracing(bench, pods, backend, run_dir, headline_server, args.output)
    if args.only_prefix:
        return only_prefix(bench, pods, backend, run_dir, headline_server, args.output)
    if args.only_streams:
        backend.stop(5)
        return only_streams(bench, servers, args, run_dir, headline_server)
    try:
        alone = bench.envoy_alone(pods)
        stack = Pickers(pods, run_dir, args.against)
        try:
            for server in servers:
                by_server[server] = bench.pickers(stack, server)
            paired = bench.paired(stack, pods, headline_server, args.latency_rounds)
            traced = bench.tracing(stack, headline_server)
            prefix = run_prefix(bench, stack, headline_server)
        finally:
            stack.stop()
        routers = {policy: bench.vllm_router(pods, policy) for policy in ("round_robin", "cache_aware")}
    finally:
        backend.stop(5)
    if not args.no_streams:
        streams = run_streams(bench, servers, args.pods, run_dir, args.against)

    result: dict[str, Any] = {
        "percentile_rule": PERCENTILE_RULE,
        "mode": SHIPPED.name,
        **headline(by_server[headline_server], paired, streams.get(headline_server)),
        "rate": args.rate,
        "decision_us_512_pods": round(schedule["schedule_critical_512_pods_us"], 1),
        "two_process_max_requests_per_s": by_server[headline_server]["two_processes"]["closed_loop"]["per_s"],
        "server": headline_server,
        "detail": {
            "what": {
                "top_level": (
                    f"picker.server={headline_server}, Envoy in the shipped mode ({SHIPPED.what}); "
                    "cpu_us_per_request and max_requests_per_s under the closed loop, p50/p99 at `rate`, "
                    "added_* = picker - Envoy alone; streamed: the streamed workload in the shipped mode, "
                    "cpu_us_per_event = picker CPU per request / events per request (tokens + usage + "
                    "[DONE]), cpu_us_per_request_unseen_responses the same workload in requests_only, "
                    "no_usage_* the workload without stream_options.include_usage (shipped_no_usage), "
                    "streamed_cpu_us_per_event the picker's in the streamed setup, envoy_* the front "
                    "Envoy's CPU per event (shipped; alone), lua_adds_envoy_cpu_us_per_event Envoy alone "
                    "with the Lua usage filter less Envoy alone (envoy_alone_lua - envoy_alone)"
                ),
                "setups": {s.name: s.what for s in SETUPS}
                | {"two_processes": "shipped, two picker processes as two endpoints of the ext_proc cluster"},
                "cpu_us_per_request": (
                    "each process's user + system CPU over the run / the run's requests; bench is this "
                    "script (the open-loop client), idle_picker a second picker without traffic"
                ),
                "cores": (
                    "CPU seconds / wall seconds; rest_of_machine: busy CPU none of these explain (the "
                    "machine's count is tick-sampled: rough at low load, it can even go below 0)"
                ),
                "busy_runs": f"runs during which others used more than {BUSY_CORES} core",
                "calibration_ms": "a fixed piece of Python work just before the run: how fast the CPU was",
                "closed_loop": (
                    f"wrk -t1 -c{args.connections}" if load.wrk else "Python client: wrk is not installed"
                ),
                "fixed_rate": "open-loop Python client, latency from each request's send",
                "streamed": (
                    f"{args.stream_connections} connections each sending completions of {STREAM_TOKENS} "
                    f'tokens back to back, "stream": true with usage, a token every {STREAM_ITL_S * 1000:g} '
                    "ms from the pods (bench/sse_pod.py, a process of its own), per server and setup; "
                    "direct = straight to the pods; inter-token = gaps between token events at the client"
                ),
                "percentiles": f"{PERCENTILE_RULE_TEXT} wrk's from every latency it recorded (1 µs steps).",
                "backend": f"{args.pods} pods: one Envoy, direct responses, /metrics = {METRICS_PAGE.name}",
                "picker_body": REWRITTEN.decode(),
            },
            "envoy_alone": alone,
            "paired": paired,
            "servers": by_server,
            "streams": streams,
            "busy_runs": busy_runs(
                {
                    "envoy_alone": alone,
                    "paired": {f"round_{i}": run for i, run in enumerate(paired["runs"], 1)},
                    "servers": by_server,
                    "vllm_router": routers,
                    "streams": streams,
                }
            ),
            "vllm_router": routers,
            "schedule_us": {k: round(v, 1) for k, v in schedule.items()},
            "director_route_us": {k: round(v, 1) for k, v in director.items()},
            "tracing": traced,
            "prefix": prefix,
        },
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average": {"start": load_at_start, "end": [round(x, 2) for x in os.getloadavg()]},
        },
        "seconds_per_run": args.seconds,
        "bench_seconds": round(time.perf_counter() - began),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    args.output.with_suffix(".md").write_text(markdown(result), encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k != "detail"}, indent=2))
    shutil.rmtree(run_dir, ignore_errors=True)
    return 0


def only_tracing(
    bench: Bench, pods: Sequence[int], backend: ManagedProcess, run_dir: Path, server: str, output: Path
) -> int:
    """``--only-tracing``: the tracing block alone, written into ``output``'s detail.tracing."""
    try:
        stack = Pickers(pods, run_dir)
        try:
            traced = bench.tracing(stack, server)
        finally:
            stack.stop()
    finally:
        backend.stop(5)
    result = json.loads(output.read_text()) if output.is_file() else {"detail": {}}
    result.setdefault("detail", {})["tracing"] = traced
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(traced["summary"], indent=2), "busy:", traced["busy_runs"])
    shutil.rmtree(run_dir, ignore_errors=True)
    return 0


def run_streams(
    bench: Bench, servers: Sequence[str], pods: int, run_dir: Path, against: Path | None
) -> dict[str, Any]:
    """The streamed workload of each server (and its ``@before``), over SSE pods of their own."""
    streams: dict[str, Any] = {}
    sse_ports = [free_port() for _ in range(pods)]
    sse_pods = start_sse_pods(sse_ports, run_dir)
    try:
        stack = Pickers(sse_ports, run_dir, against)
        try:
            for server in servers:
                streams[server] = bench.streams(stack, sse_pods, sse_ports, server)
        finally:
            stack.stop()
    finally:
        sse_pods.stop(5)
    return streams


def only_streams(
    bench: Bench, servers: Sequence[str], args: argparse.Namespace, run_dir: Path, server: str
) -> int:
    """``--only-streams``: the streamed block alone, written into ``output``'s detail.streams and its
    top-level ``streamed`` (and its markdown, when ``output`` holds a full run)."""
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    streams = run_streams(bench, servers, args.pods, run_dir, args.against)
    output: Path = args.output
    result = json.loads(output.read_text()) if output.is_file() else {"detail": {}}
    result.setdefault("detail", {})["streams"] = streams
    result["streamed"] = streamed_headline(streams[server])
    result["detail"]["streams_load_average"] = {
        "start": load_at_start,
        "end": [round(x, 2) for x in os.getloadavg()],
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    if "envoy_alone" in result["detail"]:
        output.with_suffix(".md").write_text(markdown(result), encoding="utf-8")
    summary = {
        name: {
            setup: (run["cpu_us_per_request"].get("picker"), run["cpu_us_per_event"].get("picker"))
            for setup, run in setups.items()
            if "cpu_us_per_event" in run
        }
        for name, setups in streams.items()
    }
    print(
        json.dumps(
            {"picker_cpu_us_per_request_and_event": summary} | result["detail"]["streams_load_average"]
        )
    )
    shutil.rmtree(run_dir, ignore_errors=True)
    return 0


def run_prefix(bench: Bench, stack: Pickers, server: str) -> dict[str, Any]:
    from picker_prefix import prefix_runs  # it imports this module

    return prefix_runs(bench, stack, server)


def only_prefix(
    bench: Bench, pods: Sequence[int], backend: ManagedProcess, run_dir: Path, server: str, output: Path
) -> int:
    """``--only-prefix``: the prefix block alone, written into ``output``'s detail.prefix (and its
    markdown, when ``output`` holds a full run)."""
    try:
        stack = Pickers(pods, run_dir)
        try:
            prefix = run_prefix(bench, stack, server)
        finally:
            stack.stop()
    finally:
        backend.stop(5)
    result = json.loads(output.read_text()) if output.is_file() else {"detail": {}}
    result.setdefault("detail", {})["prefix"] = prefix
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    if "envoy_alone" in result["detail"]:
        output.with_suffix(".md").write_text(markdown(result), encoding="utf-8")
    print(json.dumps({k: v for k, v in prefix.items() if k != "runs"}, indent=2))
    shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
