"""What one routing decision costs, measured in-process.

- the pure schedule (the #423 filter tree + the final pick; and config/profiles/best.yaml) over 3 and
  512 pods;
- the director (parse the body, resolve the model, rewrite the body, pick; release a request routed
  100 routes before) without gRPC;
- a full ext_proc stream (request headers + body -> two responses) through the real grpc.aio server on
  loopback, one stream at a time and 16 at a time, with the client in the same process;
- the server's CPU per stream, with the client in another process (16 streams at a time);
- the director's CPU per decision with a 4 KB prompt under config/profiles/gie-default.yaml, with its
  prefix-cache scorer and without it, and under config/profiles/best.yaml with and without its prefix
  plugins (``--prefix`` runs this case alone and writes bench/results/decision_cost_prefix.json).

Prints the numbers and writes bench/results/decision_cost.json. Takes about 25 s.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

# The benchmark starts its client process while gRPC threads run; gRPC's fork handlers only log about it.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc
import yaml
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from prometheus_client import CollectorRegistry

from pointsman_picker.context import RequestContext
from pointsman_picker.director import Director, Routing
from pointsman_picker.metrics import PickerMetrics
from pointsman_picker.scheduling import CycleState, SchedulingRequest
from pointsman_picker.scheduling.indexed import indexed
from pointsman_picker.scheduling.profiles import DEFAULT, build_profile, builtin_profiles
from pointsman_picker.server import create_app
from pointsman_picker.snapshots import StaticSnapshotSource
from pointsman_shared.config import PointsmanConfig, parse_config
from pointsman_shared.snapshot import PodSnapshot, PoolSnapshot
from pointsman_shared.stats import PERCENTILE_RULE, mean, median, percentile

T = TypeVar("T")
RESULTS = Path(__file__).parent / "results" / "decision_cost.json"
BEST = Path(__file__).parent.parent / "config" / "profiles" / "best.yaml"
GIE_DEFAULT = Path(__file__).parent.parent / "config" / "profiles" / "gie-default.yaml"
PREFIX_RESULTS = RESULTS.with_name("decision_cost_prefix.json")
NOW = time.time()


def clock() -> float:
    """Time stands a millisecond after the snapshot: it stays fresh however long the run takes, and
    every assignment counts as not yet scraped (the picker's busiest case)."""
    return NOW + 0.001


ADAPTERS = [f"adapter-{i}" for i in range(8)]
PROMPT = "Summarize the following text. " * 30  # a ~1 KB body, typical of a short completion
BODY = json.dumps({"model": "my-model", "prompt": PROMPT, "max_tokens": 100, "temperature": 0}).encode()


def make_pods(n: int, rng: random.Random) -> tuple[PodSnapshot, ...]:
    return tuple(
        PodSnapshot(
            address=f"10.0.{i // 250}.{i % 250 + 1}:8000",
            waiting=rng.randrange(0, 12),
            running=rng.randrange(0, 64),
            kv_cache_usage=rng.random() * 0.9,
            max_lora=4,
            running_adapters=frozenset(rng.sample(ADAPTERS, rng.randrange(0, 4))),
            updated_at=NOW,
        )
        for i in range(n)
    )


def config() -> PointsmanConfig:
    cfg = parse_config(
        {
            "pool": {"name": "bench"},
            "models": [
                {"modelName": "my-model", "criticality": "Critical", "targetModels": [{"name": "adapter-1"}]}
            ],
        }
    )
    picker = cfg.picker.model_copy(
        update={"listen": "127.0.0.1:0", "health_listen": "127.0.0.1:0", "metrics_listen": "127.0.0.1:0"}
    )
    return cfg.model_copy(update={"picker": picker})


def per_call_us(fn: Callable[[], object], *, budget: float = 0.6) -> float:
    """Median over 5 batches of the mean µs per call; each batch runs for about budget / 5 seconds."""
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < 0.05:
        fn()
        n += 1
    batch = max(1, int(n * (budget / 5) / 0.05))
    means = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        means.append((time.perf_counter() - start) / batch * 1e6)
    return median(means)


def bench_schedule() -> dict[str, float]:
    best = build_profile(parse_config(yaml.safe_load(BEST.read_text(encoding="utf-8"))))
    out: dict[str, float] = {}
    tree = builtin_profiles(parse_config({}))[DEFAULT]
    for prefix, profile in (("", tree), ("best_", best)):
        for n in (3, 512):
            pods = indexed(make_pods(n, random.Random(n)))  # as the director hands them over
            rng = random.Random(1)
            for name, request in (
                ("critical", SchedulingRequest("adapter-1", critical=True)),
                ("sheddable", SchedulingRequest("adapter-1", critical=False)),
            ):
                out[f"schedule_{prefix}{name}_{n}_pods_us"] = per_call_us(
                    lambda s=profile, r=request, p=pods, g=rng: s.schedule(r, p, CycleState(), g)
                )
    return out


# Requests in flight while the director routes: at the 500 req/s and ~200 ms per request,
# about 100. Each one's assignment counts on its pod until it ends (the clock never reaches a scrape);
# without an end they would pile up with every call, and what a call costs would follow how many
# calls the run made.
IN_FLIGHT = 100


def bench_director() -> dict[str, float]:
    """A route, and the release of the request routed ``IN_FLIGHT`` routes before (its stream closes)."""
    out: dict[str, float] = {}
    for n in (3, 512):
        source = StaticSnapshotSource(PoolSnapshot("bench", 1, NOW, make_pods(n, random.Random(n))))
        director = Director(
            config(),
            source,
            PickerMetrics(CollectorRegistry()),
            rng=random.Random(1),
            clock=clock,
            timer=time.perf_counter,
        )
        context = RequestContext("bench", BODY)
        flight: deque[Routing] = deque(director.route(context) for _ in range(IN_FLIGHT))

        def route(
            d: Director = director, flight: deque[Routing] = flight, context: RequestContext = context
        ) -> None:
            flight.append(d.route(context))
            d.release(flight.popleft())

        out[f"director_route_{n}_pods_us"] = per_call_us(route)
    return out


def prefix_bodies(count: int, rng: random.Random) -> list[bytes]:
    """4 KB completions: 8 system prompts of 3 KB, each followed by a 1 KB question of its own (the
    shape of chat traffic with system prompts: most of the prompt is a prefix some pod holds)."""
    systems = [f"System prompt {g}: you are a careful assistant. " * 64 for g in range(8)]
    bodies = []
    for i in range(count):
        prompt = (systems[i % 8][:3072] + f"Question {i}: " + "why? " * 250)[:4096]
        bodies.append(json.dumps({"model": "my-model", "prompt": prompt, "max_tokens": 100}).encode())
    rng.shuffle(bodies)
    return bodies


def without_affinity(node: Any) -> Any:
    """A decision tree with its ``prefix affinity`` nodes replaced by what follows them."""
    if isinstance(node, dict):
        if node.get("filter") == "prefix affinity":
            return without_affinity(node["onSuccessOrFailure"])
        return {k: without_affinity(v) for k, v in node.items()}
    return node


# least-work-prefix-filter's parameters that least-work-filter does not take.
PREFIX_ONLY = ("heldPrefixWeight", "soleHolderWeight", "idlePodFirst")


def best_without_prefix(best: dict[str, Any]) -> dict[str, Any]:
    """best.yaml less its prefix plugins: least work without the prefix, no prefix affinity, no producer."""
    plugins = []
    for plugin in best["plugins"]:
        if plugin["type"] in ("prefix-cache-affinity-filter", "approx-prefix-cache-producer"):
            continue
        if plugin["type"] == "least-work-prefix-filter":
            kept = {k: v for k, v in plugin.get("parameters", {}).items() if k not in PREFIX_ONLY}
            plugin = {**plugin, "type": "least-work-filter", "parameters": kept}
        elif plugin["type"] == "decision-tree":
            plugin = {**plugin, "parameters": {"tree": without_affinity(plugin["parameters"]["tree"])}}
        plugins.append(plugin)
    return {**best, "plugins": plugins}


def bench_prefix() -> dict[str, float]:
    """CPU µs per route (and its release), 4 KB prompts, gie-default with and without its prefix scorer
    and best with and without its prefix plugins (the index warmed by a first pass over the bodies: its
    lookups find blocks)."""
    doc = yaml.safe_load(GIE_DEFAULT.read_text(encoding="utf-8"))
    without = json.loads(json.dumps(doc))
    without["plugins"] = [p for p in without["plugins"] if p["type"] != "prefix-cache-scorer"]
    without["profiles"][0]["plugins"] = [
        e for e in without["profiles"][0]["plugins"] if e["pluginRef"] != "prefix-cache-scorer"
    ]
    best = yaml.safe_load(BEST.read_text(encoding="utf-8"))
    bodies = prefix_bodies(512, random.Random(7))
    out: dict[str, float] = {}
    for name, settings in (
        ("with_prefix", doc),
        ("without_prefix", without),
        ("best_with_prefix", best),
        ("best_without_prefix", best_without_prefix(best)),
    ):
        for n in (3, 512):
            cfg = config().model_copy(
                update={
                    k: v
                    for k, v in parse_config({**settings, "pool": {"name": "bench"}}).__dict__.items()
                    if k in ("plugins", "profiles", "picker")
                }
            )
            cfg = cfg.model_copy(update={"picker": cfg.picker.model_copy(update={"listen": "127.0.0.1:0"})})
            source = StaticSnapshotSource(PoolSnapshot("bench", 1, NOW, make_pods(n, random.Random(n))))
            director = Director(
                cfg,
                source,
                PickerMetrics(CollectorRegistry()),
                rng=random.Random(1),
                clock=clock,
                timer=time.perf_counter,
            )
            contexts = [RequestContext(f"bench-{i}", body) for i, body in enumerate(bodies)]
            for context in contexts:  # warm the index: every system prompt is held somewhere
                director.release(director.route(context))
            samples = []
            for _ in range(5):
                cpu = time.process_time()
                for context in contexts:
                    director.release(director.route(context))
                samples.append((time.process_time() - cpu) / len(contexts) * 1e6)
            out[f"director_route_4kb_{name}_{n}_pods_cpu_us"] = median(samples)
    out.update(prefix_index_bytes())
    return out


def prefix_index_bytes() -> dict[str, float]:
    """The prefix index's memory per (block, pod) entry, 100 pods of 2,000 blocks: each block on one
    pod, and each on four (a system prompt several pods hold)."""
    import tracemalloc

    from pointsman_picker.scheduling.prefix_index import PrefixIndex

    rng = random.Random(1)
    pods = [f"10.0.{i // 250}.{i % 250 + 1}:8000" for i in range(100)]
    shared = [[rng.getrandbits(64) for _ in range(2000)] for _ in range(25)]
    out = {}
    tracemalloc.start()
    try:
        for name, blocks in (
            ("one_pod", lambda i: [rng.getrandbits(64) for _ in range(2000)]),
            ("four_pods", lambda i: shared[i % 25]),
        ):
            index = PrefixIndex()
            before = tracemalloc.get_traced_memory()[0]
            for i, pod in enumerate(pods):
                index.add(pod, blocks(i), 2000, 0.0, 60.0)
            out[f"prefix_index_bytes_per_entry_{name}"] = (tracemalloc.get_traced_memory()[0] - before) / len(
                index
            )
    finally:
        tracemalloc.stop()
    return out


def messages() -> list[pb.ProcessingRequest]:
    header_map = base_pb2.HeaderMap(
        headers=[
            base_pb2.HeaderValue(key=k, raw_value=v.encode())
            for k, v in ((":method", "POST"), (":path", "/v1/completions"), ("x-request-id", "bench"))
        ]
    )
    return [
        pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=header_map)),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=BODY, end_of_stream=True)),
    ]


async def run_streams(stub: pb_grpc.ExternalProcessorStub, total: int, concurrency: int) -> list[float]:
    """Run ``total`` streams, ``concurrency`` at a time; the µs each took."""
    request = messages()
    timings: list[float] = []

    async def client() -> None:
        for _ in range(total // concurrency):
            start = time.perf_counter()
            answers = [answer async for answer in stub.Process(iter(request))]
            timings.append((time.perf_counter() - start) * 1e6)
            assert answers[1].WhichOneof("response") == "request_body", answers[1]

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return timings


async def bench_streams(pods: int) -> dict[str, float]:
    source = StaticSnapshotSource(PoolSnapshot("bench", 1, NOW, make_pods(pods, random.Random(pods))))
    app = create_app(config(), source=source, registry=CollectorRegistry(), rng=random.Random(1), clock=clock)
    await app.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.port}")
    stub = pb_grpc.ExternalProcessorStub(channel)
    try:
        await run_streams(stub, 200, 1)  # warm up
        timings = await run_streams(stub, 2000, 1)
        start = time.perf_counter()
        await run_streams(stub, 4000, 16)
        elapsed = time.perf_counter() - start
        # The same load from another process: what the server alone spends per stream.
        total = 4000
        cpu = time.process_time()
        start = time.perf_counter()
        child = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--client", str(app.port), str(total), "16"
        )
        if await child.wait() != 0:
            raise RuntimeError("the client process failed")
        external = time.perf_counter() - start
        server_cpu = time.process_time() - cpu
    finally:
        await channel.close()
        await app.stop(0)
    key = f"{pods}_pods"
    return {
        f"stream_sequential_{key}_mean_us": mean(timings),
        f"stream_sequential_{key}_p50_us": percentile(timings, 0.5),
        f"stream_sequential_{key}_p99_us": percentile(timings, 0.99),
        f"stream_concurrent16_{key}_per_s": 4000 / elapsed,
        f"stream_other_process_client16_{key}_per_s": total / external,
        f"stream_other_process_client16_{key}_server_cpu_us": server_cpu / total * 1e6,
    }


async def bench_all_streams() -> dict[str, float]:
    return {**await bench_streams(3), **await bench_streams(512)}


async def client_process(port: int, total: int, concurrency: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await run_streams(pb_grpc.ExternalProcessorStub(channel), total, concurrency)


def run(coro_factory: Callable[[], Coroutine[Any, Any, T]]) -> tuple[T, str]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro_factory()), "asyncio"
    return uvloop.run(coro_factory()), "uvloop"


def main() -> int:
    if sys.argv[1:2] == ["--client"]:
        port, total, concurrency = map(int, sys.argv[2:5])
        run(lambda: client_process(port, total, concurrency))
        return 0
    if sys.argv[1:2] == ["--prefix"]:
        return write(
            PREFIX_RESULTS, bench_prefix(), "asyncio (not used)", len(prefix_bodies(1, random.Random(7))[0])
        )
    streams, loop = run(bench_all_streams)
    numbers = {**bench_schedule(), **bench_director(), **bench_prefix(), **streams}
    return write(RESULTS, numbers, loop, len(BODY))


def write(path: Path, numbers: dict[str, float], loop: str, body_bytes: int) -> int:
    result = {
        "percentile_rule": PERCENTILE_RULE,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "event_loop": loop,
        "grpcio": grpc.__version__,
        "body_bytes": body_bytes,
        # others' work on this shared machine: above the core count, every figure is inflated
        "load_average_1m": round(os.getloadavg()[0], 2),
        "numbers": {k: round(v, 1) for k, v in numbers.items()},
    }
    for name, value in result["numbers"].items():
        print(f"{name:48s} {value:>12,.1f}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
