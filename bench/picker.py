"""`make bench-picker`: the picker behind a real Envoy, side by side with Envoy alone and vllm-router.

One run, one machine, the same three simulator pods behind every setup:

- Envoy alone (no ext_proc, round robin over the pods): the floor;
- Envoy + one picker (the local stack's Envoy config: #423 tree, body rewrite, response metrics);
- Envoy + two pickers (two endpoints of the ext_proc cluster);
- vllm-router (PyPI, Rust) in front of the same pods, when `.venv-bench` has it (the bench target
  installs it there, pinned in requirements/bench.txt).

Latency: an open-loop client at a fixed rate (``--rate``, default 500 req/s) over keep-alive
connections; each latency counts from when the request was due, so queueing shows. Throughput: a
closed loop (``--connections`` clients back to back). CPU per decision: the picker process's user +
system CPU over the fixed-rate run, per request. Writes bench/results/picker.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from decision_cost import bench_director, bench_schedule

from pointsman_devstack import envoy
from pointsman_devstack.ports import free_port
from pointsman_devstack.process import ManagedProcess
from pointsman_devstack.readiness import http_ok, wait_ready
from pointsman_devstack.stack import SimOptions, Stack, StackOptions, StackPorts
from pointsman_shared.config import load_config

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "picker.json"
CONFIG = ROOT / "config" / "local.yaml"
ROUTER = ROOT / ".venv-bench" / "bin" / "vllm-router"
# Through the picker: a model with targets, so every decision also rewrites the body. Envoy alone and
# vllm-router cannot rewrite, so they get the base model the pods serve under its own name.
REWRITTEN = json.dumps({"model": "tweet-summary", "prompt": "Summarize: points.", "max_tokens": 1}).encode()
PLAIN = json.dumps(
    {"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "Summarize: points.", "max_tokens": 1}
).encode()
PATH = "/v1/completions"
JSON = {"content-type": "application/json"}


# -- a small HTTP/1.1 keep-alive client (httpx would cost more CPU than the picker) --------------------
class Connection:
    def __init__(self, host: str, port: int, body: bytes) -> None:
        self._host, self._port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._request = (
            f"POST {PATH} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    async def post(self) -> int:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        assert self._reader is not None
        self._writer.write(self._request)
        head = await self._reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        if "content-length" in headers:
            await self._reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding") == "chunked":
            while True:
                size = int((await self._reader.readline()).strip(), 16)
                await self._reader.readexactly(size + 2)
                if size == 0:
                    break
        if headers.get("connection") == "close":
            self.close()
        return status

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def fixed_rate(
    port: int, body: bytes, rate: float, seconds: float, connections: int = 32
) -> dict[str, Any]:
    """Open loop: request i is due at start + i / rate; latency counts from then."""
    idle = [Connection("127.0.0.1", port, body) for _ in range(connections)]
    free = asyncio.Queue[Connection]()
    for conn in idle:
        free.put_nowait(conn)
    latencies: list[float] = []
    errors = 0
    total = int(rate * seconds)
    start = time.perf_counter() + 0.05

    async def one(due: float) -> None:
        nonlocal errors
        conn = await free.get()
        try:
            status = await conn.post()
        except (OSError, asyncio.IncompleteReadError, ValueError):
            conn.close()
            status = 0
        free.put_nowait(conn)
        if status == 200:
            latencies.append(time.perf_counter() - due)
        else:
            errors += 1

    tasks = []
    for i in range(total):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(due)))
    await asyncio.gather(*tasks)
    for conn in idle:
        conn.close()
    return {
        "requests": total,
        "errors": errors,
        "p50_ms": round(percentile(latencies, 0.5) * 1000, 3) if latencies else None,
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 3) if latencies else None,
    }


async def closed_loop(port: int, body: bytes, connections: int, seconds: float) -> float:
    """Requests per second with ``connections`` clients sending back to back."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal done
        conn = Connection("127.0.0.1", port, body)
        while time.perf_counter() < deadline:
            if await conn.post() == 200:
                done += 1
        conn.close()

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(connections)))
    return done / (time.perf_counter() - began)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the setups -----------------------------------------------------------------------------------
def start_stack(run_dir: Path, replicas: int) -> Stack:
    config = load_config(CONFIG, environ={})
    options = StackOptions(
        config_path=CONFIG,
        run_dir=run_dir,
        ports=StackPorts.free(len(config.pool.endpoints), picker_replicas=replicas),
        sim=SimOptions.for_config(config, speedup=1000.0),
        environ={k: v for k, v in os.environ.items() if k != "REDIS_URL"},
        envoy_concurrency=1,
    )
    stack = Stack(options)
    stack.start()
    return stack


def start_envoy(doc: dict[str, Any], name: str, admin: int, run_dir: Path) -> ManagedProcess:
    path = run_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    argv = [envoy.find_envoy(), "-c", str(path), "--disable-hot-restart", "--concurrency", "1"]
    process = ManagedProcess(name, argv, env={}, log_path=run_dir / f"{name}.log")
    with httpx.Client(timeout=1.0) as client:
        wait_ready(process, http_ok(client, f"http://127.0.0.1:{admin}/ready"), timeout=30, what="ready")
    return process


def envoy_requests_only(stack: Stack, run_dir: Path) -> tuple[ManagedProcess, int]:
    """A second Envoy in front of the stack's picker that sends it requests only (no responses):
    the issue's baseline shape (headers SEND + body BUFFERED)."""
    gateway, admin = free_port(), free_port()
    options = envoy.EnvoyOptions(
        gateway_listen=f"127.0.0.1:{gateway}",
        admin_listen=f"127.0.0.1:{admin}",
        pickers=(f"127.0.0.1:{stack.ports.picker}",),
        response_processing=False,
    )
    return start_envoy(envoy.bootstrap(options), "envoy-requests-only", admin, run_dir), gateway


def envoy_alone(stack: Stack, run_dir: Path) -> tuple[ManagedProcess, int]:
    """Envoy with the stack's listener minus ext_proc, round robin over the same pods."""
    gateway, admin = free_port(), free_port()
    options = envoy.EnvoyOptions(
        gateway_listen=f"127.0.0.1:{gateway}", admin_listen=f"127.0.0.1:{admin}", pickers=("127.0.0.1:1",)
    )
    doc = envoy.bootstrap(options)
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"] = hcm["http_filters"][1:]
    hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"] = "pods"
    hosts = [address.split(":") for address in stack.pod_addresses]
    doc["static_resources"]["clusters"] = [
        {
            "name": "pods",
            "type": "STATIC",
            "connect_timeout": "1s",
            "load_assignment": {
                "cluster_name": "pods",
                "endpoints": [
                    {
                        "lb_endpoints": [
                            {
                                "endpoint": {
                                    "address": {"socket_address": {"address": h, "port_value": int(p)}}
                                }
                            }
                            for h, p in hosts
                        ]
                    }
                ],
            },
        }
    ]
    return start_envoy(doc, "envoy-alone", admin, run_dir), gateway


def vllm_router(stack: Stack, run_dir: Path, policy: str) -> tuple[ManagedProcess, int] | None:
    if not ROUTER.is_file():
        return None
    port = free_port()
    urls = [f"http://{address}" for address in stack.pod_addresses]
    argv = [
        str(ROUTER),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--policy",
        policy,
        "--worker-urls",
        *urls,
    ]
    # Its default logs a line per request, which this script's output pump would pay for.
    argv += ["--prometheus-port", str(free_port()), "--log-level", "warning"]
    log_path = run_dir / f"vllm-router-{policy}.log"
    process = ManagedProcess("vllm-router", argv, env=dict(os.environ), log_path=log_path)
    with httpx.Client(timeout=1.0) as client:

        def ready() -> str | None:
            try:
                client.post(f"http://127.0.0.1:{port}{PATH}", content=PLAIN, headers=JSON).raise_for_status()
            except httpx.HTTPError as exc:
                return str(exc)
            return None

        wait_ready(process, ready, timeout=60, what="a completion through the router")
    return process, port


def run(coroutine: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(coroutine())  # type: ignore[arg-type]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    rate, seconds = args.rate, args.seconds
    random.seed(0)
    out: dict[str, Any] = {}
    schedule = bench_schedule()
    director = bench_director()
    out["decision_us_512_pods"] = round(schedule["schedule_critical_512_pods_us"], 1)
    detail: dict[str, Any] = {
        "schedule_us": {k: round(v, 1) for k, v in schedule.items()},
        "director_route_us": {k: round(v, 1) for k, v in director.items()},
    }
    run_dir = Path(tempfile.mkdtemp(prefix="bench-picker-"))
    stack = start_stack(run_dir / "one", 1)
    try:
        alone, alone_port = envoy_alone(stack, run_dir)
        try:
            base = run(lambda: fixed_rate(alone_port, PLAIN, rate, seconds))
            detail["envoy_alone_max_per_s"] = round(
                run(lambda: closed_loop(alone_port, PLAIN, args.connections, seconds))
            )
        finally:
            alone.stop(5)
        picker = next(p for p in stack.processes if p.name == "picker")
        pid = picker.pid
        before = cpu_seconds(pid)
        with_picker = run(lambda: fixed_rate(stack.ports.gateway, REWRITTEN, rate, seconds))
        spent = cpu_seconds(pid) - before
        out["cpu_us_per_decision"] = round(spent / with_picker["requests"] * 1e6, 1)
        before = cpu_seconds(pid)
        began = time.perf_counter()
        out["max_decisions_per_s"] = round(
            run(lambda: closed_loop(stack.ports.gateway, REWRITTEN, args.connections, seconds))
        )
        busy = (cpu_seconds(pid) - before) / (time.perf_counter() - began)
        detail["picker_cpu_share_at_max"] = round(busy, 2)
        lean, lean_port = envoy_requests_only(stack, run_dir)
        try:
            before = cpu_seconds(pid)
            requests_only = run(lambda: fixed_rate(lean_port, REWRITTEN, rate, seconds))
            spent = cpu_seconds(pid) - before
        finally:
            lean.stop(5)
        detail["requests_only"] = {
            "cpu_us_per_decision": round(spent / requests_only["requests"] * 1e6, 1),
            "p50_ms": requests_only["p50_ms"],
            "p99_ms": requests_only["p99_ms"],
            "errors": requests_only["errors"],
        }
        # round_robin spreads like Envoy alone, so the difference is the router itself; its default,
        # cache_aware, sends this benchmark's identical prompts to one pod (kept in the detail).
        by_policy: dict[str, dict[str, Any]] = {}
        for policy in ("round_robin", "cache_aware"):
            router = vllm_router(stack, run_dir, policy)
            if router is None:
                by_policy[policy] = {"p50_ms": None, "p99_ms": None, "note": "run `make bench-picker`"}
                continue
            try:
                by_policy[policy] = run(lambda port=router[1]: fixed_rate(port, PLAIN, rate, seconds))
            finally:
                router[0].stop(5)
        routed = by_policy["round_robin"]
        detail["vllm_router_cache_aware"] = by_policy["cache_aware"]
    finally:
        stack.stop()
    two = start_stack(run_dir / "two", 2)
    try:
        out["two_process_max_decisions_per_s"] = round(
            run(lambda: closed_loop(two.ports.gateway, REWRITTEN, args.connections, seconds))
        )
    finally:
        two.stop()
    out.update(
        rate=rate,
        envoy_p50_ms=base["p50_ms"],
        envoy_p99_ms=base["p99_ms"],
        picker_p50_ms=with_picker["p50_ms"],
        picker_p99_ms=with_picker["p99_ms"],
        vllm_router_p50_ms=routed["p50_ms"],
        vllm_router_p99_ms=routed["p99_ms"],
    )
    detail["errors"] = {
        "envoy": base["errors"],
        "picker": with_picker["errors"],
        "vllm_router": routed.get("errors"),
    }
    result = {
        **out,
        "detail": detail,
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "seconds_per_run": seconds,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
