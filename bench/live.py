"""`make bench-live`: a routing-quality scenario through the real stack, beside the same scenario in
virtual time.

Each run starts fresh processes on this machine (traffic to 127.0.0.1 only) and stops them after:

- ``pointsman-*`` / ``gie-default`` (any Pointsman contender of the quality bench): the local stack
  (``pointsman_devstack.Stack``: Redis, the simulator pods, the collector, the picker with that
  contender's config, Envoy with ext_proc), the load sent to Envoy;
- ``envoy-round-robin`` / ``envoy-least-request``: the pods behind an Envoy with a plain STATIC
  cluster (``ROUND_ROBIN`` / ``LEAST_REQUEST``), no picker;
- ``vllm-router-round-robin`` / ``vllm-router-power-of-two`` / ``vllm-router-cache-aware``: the pods
  behind vllm-router (PyPI, ``.venv-bench``) with that policy (``cache_aware``: its prefix tree over
  the prompts' text, by its own in-flight counts; no virtual twin, so its runs have live figures only);
- ``<a Pointsman contender>-2-pickers-shared``: the same stack with two pickers behind the one Envoy
  (its ext_proc cluster spreads the streams over them), sharing the prefix index through Redis as
  deployed (the virtual twin: two Directors with a 60 ms delayed shared index). Live pickers always
  share it, so ``-2-pickers`` (unshared) runs in virtual time only.

The load is inference-perf (PyPI, ``.venv-perf``): it replays the scenario's trace (arrival times and
lengths: ``trace_replay`` + ``random`` data with a trace file) and draws each request's adapter by
``lora_traffic_split``; streaming completions; an offline tokenizer built here
(``bench/live_tokenizer.py``). ``--client builtin`` (and the fallback when inference-perf cannot run)
replays the same trace with its own open-loop client (``bench/live_client.py``), adapters included.
A scenario whose prompts share prefixes (``traffic.prompts``: shared-prefix, multi-turn) runs with the
builtin client, which sends each request's text as its token spans spell it (4 letters a token, the
simulator's stand-in tokenizer), so the pods' prefix caches, the picker's index and the virtual replay
see the same sharing; inference-perf's own shared-prefix generator draws other prompts at its own
times, which no virtual replay could follow.

Prefix caching: each run reads every pod's ``vllm:prefix_cache_queries_total`` and ``_hits_total``
when the counted arrivals begin and after the last response: ``prefix_hit_rate`` is hits / queries
(tokens) over the counted part, the virtual runs' figure of the same name beside it.

Time scale: two cores cannot run the scenario's fleet at its real speed. The pods run ``--speedup
1/k`` (every step and adapter load k times longer) at 1/k of the arrival rate; the virtual runs use
the same k-times-slower engine (``pointsman_quality.time_scaled``), so live and virtual measure
one system, in wall seconds. Levels are fractions of the reference contender's capacity (the quality
bench's definition, searched in virtual time on the unscaled engine, or ``--capacity``).

Live vs virtual: each live run is replayed in virtual time with exactly the requests the client sent
(arrivals, lengths and models), over ``--virtual-seeds`` router seeds; the agreement is live / the
median of those. Each run starts with ``--warmup`` seconds of arrivals (default k x 1 s) that are sent
but not counted, live and virtual alike: the cold start (every adapter loaded from disk, k times
slower) otherwise decides the p90 through a handful of early routing choices. Required: p50 and
p90 TTFT of the reference (``pointsman-423``, the picker's default profile) within 20% at levels
0.4-0.6 of its capacity; the others' agreement is reported, with each Pointsman contender's level as a
fraction of its own capacity (``own_load``).
Every run records the CPU each process used and what the rest of the machine did (``disturbed``).
Writes ``bench/results/live-SCENARIO.json`` and ``.md``; logs stay in ``.run/live-*``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from live_client import LiveRequest, replay
from picker import BUSY_CORES, alone_bootstrap, calibration_ms, start_envoy

from pointsman_devstack.ports import free_port
from pointsman_devstack.process import ManagedProcess
from pointsman_devstack.readiness import wait_ready
from pointsman_devstack.stack import LOOPBACK, Stack, StackOptions, StackPorts
from pointsman_quality import live_report
from pointsman_quality.agreement import AGREEMENT_METRICS, COMPARED_METRICS, TOLERANCE, agreement
from pointsman_quality.contenders import BASELINES, POINTSMAN, SHARED, Contender, contenders, replicas
from pointsman_quality.live_fleet import live_scenario, sim_args
from pointsman_quality.live_stats import RequestResult, live_stats, prefix_cache_totals, send_lag
from pointsman_quality.perf_config import azure_trace, lora_traffic_split, perf_config
from pointsman_quality.perf_results import as_sent, perf_results
from pointsman_quality.runs import RunStats
from pointsman_quality.scenario import Scenario, Variant, engine_configs, load_scenario
from pointsman_quality.sweep import Capacity, CapacityMethod, Sweep
from pointsman_quality.timescale import time_scaled
from pointsman_quality.virtual_replay import median_stats, virtual_run
from pointsman_quality.workload import ModelMix, build_trace
from pointsman_shared import aio
from pointsman_shared.stats import PERCENTILE_RULE
from pointsman_sim.__main__ import build_parser, pod_specs
from pointsman_sim.engine import EngineConfig
from pointsman_sim.fleet import TraceRequest, run_fleet
from pointsman_sim.openai_protocol import filler_text
from pointsman_sim.prefix import prompt_text

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PROFILES = ROOT / "config" / "profiles"
DEFAULT_SCENARIO = ROOT / "bench" / "scenarios" / "multi-lora.yaml"
VENV_BIN = Path(sys.executable).parent
ROUTER = ROOT / ".venv-bench" / "bin" / "vllm-router"
PERF = ROOT / ".venv-perf" / "bin" / "inference-perf"
PERF_PYTHON = ROOT / ".venv-perf" / "bin" / "python"
TOKENIZER_SCRIPT = Path(__file__).parent / "live_tokenizer.py"
HOST = LOOPBACK

# Live contenders without the picker, and the virtual contender each is compared with.
PLAIN = {
    "envoy-round-robin": ("envoy", "ROUND_ROBIN", "round-robin"),
    "envoy-least-request": ("envoy", "LEAST_REQUEST", "least-request"),
    "vllm-router-round-robin": ("vllm-router", "round_robin", "round-robin"),
    # vllm-router's power_of_two: the less loaded of two random workers, by its own in-flight count.
    "vllm-router-power-of-two": ("vllm-router", "power_of_two", "least-request"),
    # vllm-router's cache_aware (its default): a prefix tree of the prompts' text per worker, balanced
    # by in-flight counts; no virtual contender does the same.
    "vllm-router-cache-aware": ("vllm-router", "cache_aware", ""),
}
# The picker's default (#423 tree), the tuned profile where config/profiles/ has it, upstream's default
# scoring, then the routers without the picker.
DEFAULT_CONTENDERS = (
    "pointsman-423",
    *(["pointsman-best"] if (PROFILES / str(POINTSMAN["pointsman-best"])).is_file() else []),
    "gie-default",
    *PLAIN,
)
# The "moderate load" at which the reference contender's (the picker's default, #423) live and virtual
# TTFT must agree: fractions of its own capacity.
REQUIRED_LEVELS = (0.4, 0.6)
MACHINE_SATURATED = 0.9  # of every core: the machine itself ran out of CPU
# The virtual replay again with snapshots this far apart: how much the result depends on the age of the
# routing data (live: each pod scraped on its own jittered 50 ms timer, publishes at most every 25 ms).
STALE_SNAPSHOT_S = 0.075
# The default warm-up, in unscaled seconds: the fleet's cold start (each pod loading its adapters from
# disk, a first queue forming and draining) is over well within it at the levels run here.
WARMUP_UNSCALED_S = 1.0


# -- processes ------------------------------------------------------------------------------------
class LiveStack(Stack):
    """The local stack, its pods running the scenario's engine (the stack's own sim flags cover only
    some engine values)."""

    def __init__(self, options: StackOptions, sim_flags: Sequence[str]) -> None:
        super().__init__(options)
        self._sim_flags = list(sim_flags)

    def _sim_args(self, ports: Sequence[int]) -> list[str]:
        return ["--host", self.host, "--ports", ",".join(str(p) for p in ports), *self._sim_flags]


def console_script(name: str) -> str:
    return str(VENV_BIN / name)


def wait_models(process: ManagedProcess, base_url: str, timeout: float = 60.0) -> None:
    """Ready once ``GET /v1/models`` answers 200 through ``base_url`` (no generation: the pods' engines
    stay as the virtual run starts them, empty)."""
    with httpx.Client(timeout=2.0, trust_env=False) as client:

        def probe() -> str | None:
            try:
                response = client.get(f"{base_url}/v1/models")
            except httpx.HTTPError as exc:
                return f"{type(exc).__name__} {exc}"
            return None if response.status_code == 200 else f"HTTP {response.status_code}"

        wait_ready(process, probe, timeout=timeout, what=f"GET {base_url}/v1/models 200")


@dataclass
class Live:
    """What one live run started: its processes (stopped in reverse), the URL to load, CPU by name."""

    base_url: str = ""
    pods: list[str] = field(default_factory=list)  # host:port of each pod
    processes: dict[str, int] = field(default_factory=dict)
    stops: list[Callable[[], None]] = field(default_factory=list)

    def stop(self) -> None:
        while self.stops:
            with contextlib.suppress(Exception):
                self.stops.pop()()


@contextlib.contextmanager
def started(
    name: str,
    kind: str,
    config: Contender | None,
    policy: str,
    pods: int,
    sim_flags: list[str],
    run_dir: Path,
) -> Iterator[Live]:
    """The processes of one live contender, stopped on the way out (exceptions and Ctrl-C too)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    out = Live()
    try:
        if kind == "pointsman":
            assert config is not None
            assert config.config is not None
            ports = StackPorts.free(pods, picker_replicas=config.pickers)
            doc = config.config.model_dump(mode="json", by_alias=True, exclude_none=True)
            doc["pool"]["endpoints"] = [f"{HOST}:{p}" for p in ports.pods]
            path = run_dir / f"{name}.yaml"
            path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
            environ = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
            stack = LiveStack(
                StackOptions(
                    config_path=path,
                    run_dir=run_dir / "stack",
                    ports=ports,
                    environ=environ,
                    allow_docker=False,
                    envoy_concurrency=1,
                ),
                sim_flags,
            )
            out.stops.append(stack.stop)
            stack.start()
            out.base_url = stack.gateway_url
            out.pods = [f"{HOST}:{p}" for p in ports.pods]
            out.processes = {p.name: p.pid for p in stack.processes}
            redis = getattr(stack.redis, "_process", None)
            if redis is not None:
                out.processes["redis"] = redis.pid
            wait_models(stack.processes[-1], out.base_url)
        else:
            ports_list = [free_port() for _ in range(pods)]
            argv = [
                console_script("pointsman-sim"),
                "--host",
                HOST,
                "--ports",
                ",".join(map(str, ports_list)),
            ]
            sim = ManagedProcess(
                "sim", [*argv, *sim_flags], env=dict(os.environ), log_path=run_dir / "sim.log"
            )
            out.stops.append(lambda: sim.stop(5))
            out.processes["sim"] = sim.pid
            out.pods = [f"{HOST}:{p}" for p in ports_list]
            for port in ports_list:
                wait_models(sim, f"http://{HOST}:{port}")
            if kind == "envoy":
                doc, gateway = alone_bootstrap(ports_list)
                cluster = doc["static_resources"]["clusters"][0]
                cluster["lb_policy"] = policy
                proxy = start_envoy(doc, "envoy", run_dir)
                out.stops.append(lambda: proxy.stop(5))
                out.processes["envoy"] = proxy.pid
                out.base_url = f"http://{HOST}:{gateway}"
                wait_models(proxy, out.base_url)
            else:
                if not ROUTER.is_file():
                    raise RuntimeError(f"{ROUTER} is missing: `make bench-live` installs it (.venv-bench)")
                port = free_port()
                argv = [str(ROUTER), "--host", HOST, "--port", str(port), "--policy", policy, "--worker-urls"]
                argv += [f"http://{HOST}:{p}" for p in ports_list]
                argv += ["--prometheus-port", str(free_port()), "--log-level", "warning"]
                router = ManagedProcess(
                    "vllm-router", argv, env=dict(os.environ), log_path=run_dir / "vllm-router.log"
                )
                out.stops.append(lambda: router.stop(5))
                out.processes["vllm-router"] = router.pid
                out.base_url = f"http://{HOST}:{port}"
                wait_models(router, out.base_url, timeout=120)
        yield out
    finally:
        out.stop()


# -- CPU ------------------------------------------------------------------------------------------
def _busy(times: Any) -> float:
    return float(sum(getattr(times, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal")))


class Meter:
    """CPU of the run's processes (psutil), of the client, and of the whole machine, over one run."""

    def __init__(self, processes: dict[str, int]) -> None:
        self._procs = {}
        for name, pid in processes.items():
            with contextlib.suppress(psutil.Error):
                self._procs[name] = psutil.Process(pid)
        self._before = {name: self._cpu(p) for name, p in self._procs.items()}
        self._self_before = self._cpu(psutil.Process())
        self._machine = _busy(psutil.cpu_times())
        self._began = time.perf_counter()
        self.calibration_ms = calibration_ms()

    @staticmethod
    def _cpu(process: psutil.Process) -> float:
        try:
            t = process.cpu_times()
        except psutil.Error:
            return 0.0
        return float(t.user + t.system)

    def stop(self, client: str, client_cpu: float | None) -> dict[str, Any]:
        wall = time.perf_counter() - self._began
        machine = _busy(psutil.cpu_times()) - self._machine
        seconds = {name: self._cpu(p) - self._before[name] for name, p in self._procs.items()}
        bench = self._cpu(psutil.Process()) - self._self_before
        # The builtin client is this process; inference-perf is a child measured by its rusage.
        seconds["client" if client == "builtin" else "bench"] = bench
        if client_cpu is not None:
            seconds["client"] = client_cpu
        ours = sum(seconds.values())
        rest = machine - ours
        cpus = psutil.cpu_count() or 1
        return {
            "wall_s": round(wall, 1),
            "cores": {name: round(s / wall, 3) for name, s in seconds.items()},
            "ours_cores": round(ours / wall, 2),
            "machine_cores": round(machine / wall, 2),
            "rest_of_machine_cores": round(rest / wall, 2),
            "disturbed": rest / wall > BUSY_CORES,
            "saturated": machine / wall > MACHINE_SATURATED * cpus,
            "calibration_ms": self.calibration_ms,
        }


# -- prefix caching -------------------------------------------------------------------------------
def prefix_counters(pods: Sequence[str]) -> tuple[float, float] | None:
    """Every pod's prefix-cache queries and hits (tokens) summed; None when a pod does not answer or
    does not export them."""
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        try:
            pages = [client.get(f"http://{pod}/metrics").text for pod in pods]
        except httpx.HTTPError:
            return None
    return prefix_cache_totals(pages)


class PrefixWindow:
    """The pods' prefix-cache counters when the counted arrivals begin (a timer ``warmup`` s after the
    run starts) and at the end: the hit rate over the counted part, and over the whole run."""

    def __init__(self, pods: Sequence[str], warmup: float) -> None:
        self._pods = list(pods)
        self.start = prefix_counters(self._pods)
        self.counted: tuple[float, float] | None = None
        self._timer = threading.Timer(warmup, self._mark)
        self._timer.daemon = True
        self._timer.start()

    def _mark(self) -> None:
        self.counted = prefix_counters(self._pods)

    def stop(self) -> dict[str, Any] | None:
        self._timer.cancel()
        end = prefix_counters(self._pods)
        if end is None or self.start is None:
            return None

        def rate(since: tuple[float, float]) -> float | None:
            queries, hits = end[0] - since[0], end[1] - since[1]
            return round(hits / queries, 4) if queries > 0 else None

        out: dict[str, Any] = {
            "queries_tokens": end[0] - self.start[0],
            "hits_tokens": end[1] - self.start[1],
        }
        out["hit_rate_with_warmup"] = rate(self.start)
        out["hit_rate"] = rate(self.counted) if self.counted is not None else None
        return out


# -- the clients ----------------------------------------------------------------------------------
class ClientFailed(RuntimeError):
    pass


def run_bounded(
    argv: Sequence[str], log_path: Path, env: dict[str, str], timeout: float
) -> tuple[int, float]:
    """Run ``argv`` in its own session, output to ``log_path``; kill its group past ``timeout`` s
    (and on any exception, Ctrl-C included). Returns its exit code and the CPU seconds it and its
    children (the workers it waited for) used."""
    with log_path.open("w", encoding="utf-8") as log:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    try:
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                child.returncode = os.waitstatus_to_exitcode(status)
                return child.returncode, usage.ru_utime + usage.ru_stime
            if time.monotonic() > deadline:
                raise ClientFailed(f"{argv[0]} still running after {timeout:.0f}s: killed")
            time.sleep(0.2)
    finally:
        if child.returncode is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=5)
                    break
            child.wait()


def offline_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    # Nothing from a hub, ever: the tokenizer is a local directory.
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", NO_PROXY="*")
    env.update(PYTHONUNBUFFERED="1", HF_HUB_DISABLE_TELEMETRY="1", DO_NOT_TRACK="1")
    return env


def build_tokenizer(run_dir: Path) -> Path:
    """The offline tokenizer inference-perf loads; raises :class:`ClientFailed` with the reason."""
    if not PERF.is_file() or not PERF_PYTHON.is_file():
        raise ClientFailed(
            f"{PERF} is missing (`make bench-live` builds .venv-perf; it needs Python >= 3.12)"
        )
    out = run_dir / "tokenizer"
    words = sorted(set(filler_text(0, 1000).split()))
    code, _ = run_bounded(
        [str(PERF_PYTHON), str(TOKENIZER_SCRIPT), str(out), *words],
        run_dir / "tokenizer.log",
        offline_env(),
        300,
    )
    if code != 0:
        tail = (run_dir / "tokenizer.log").read_text(errors="replace")[-1500:]
        raise ClientFailed(f"building the tokenizer failed ({code}):\n{tail}")
    return out


def perf_run(
    base_url: str,
    scenario: Scenario,
    trace: Sequence[TraceRequest],
    rate: float,
    duration: float,
    tokenizer: Path,
    run_dir: Path,
    timeout: float,
    seed: int,
) -> tuple[list[RequestResult], float]:
    trace_file = run_dir / "trace.csv"
    trace_file.write_text(azure_trace(trace), encoding="utf-8")
    report = run_dir / "perf-report"
    config = perf_config(
        base_url=base_url,
        model=scenario.traffic.base_model,
        trace_file=str(trace_file),
        tokenizer_dir=str(tokenizer),
        report_dir=str(report),
        lora_split=lora_traffic_split(scenario),
        duration=duration,
        rate=rate,
        seed=seed,
        request_timeout=timeout,
    )
    path = run_dir / "inference-perf.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    log = run_dir / "inference-perf.log"
    code, cpu = run_bounded([str(PERF), "--config_file", str(path)], log, offline_env(), timeout + 120)
    found = sorted(report.glob("**/per_request_lifecycle_metrics.json"))
    if code != 0 or not found:
        tail = log.read_text(errors="replace")[-2000:]
        raise ClientFailed(
            f"inference-perf exited with {code}, report {'found' if found else 'missing'}:\n{tail}"
        )
    entries = json.loads(found[0].read_text(encoding="utf-8"))
    return perf_results(entries), cpu


def builtin_run(
    base_url: str, scenario: Scenario, trace: Sequence[TraceRequest], timeout: float
) -> list[RequestResult]:
    base = scenario.traffic.base_model
    lead = trace[0].arrival if trace else 0.0
    requests = [
        LiveRequest(
            r.arrival - lead,
            r.adapter or base,
            r.prompt_tokens,
            r.max_tokens,
            prompt_text(r.tokens, r.prompt_tokens) if r.tokens else None,
        )
        for r in trace
    ]
    return aio.run(replay(base_url, requests, request_timeout=timeout, run_timeout=timeout + 60))


# -- planning -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LiveContender:
    name: str
    kind: str  # pointsman | envoy | vllm-router
    policy: str
    virtual: str  # the virtual contender it is compared with


def resolve_contenders(names: Sequence[str], scenario: Scenario) -> list[LiveContender]:
    extras = {c.name for c in scenario.extra_contenders}
    out = []
    for name in names:
        if name in PLAIN:
            kind, policy, virtual = PLAIN[name]
            out.append(LiveContender(name, kind, policy, virtual))
        elif (
            name in POINTSMAN or name in extras or (replicas(name)[0] in POINTSMAN and name.endswith(SHARED))
        ):
            out.append(LiveContender(name, "pointsman", "", name))
        else:
            known = ", ".join([*PLAIN, *POINTSMAN, *extras])
            raise SystemExit(f"unknown live contender {name!r} (known: {known})")
    return out


def virtual_contenders(scenario: Scenario, names: set[str], scenario_dir: Path) -> dict[str, Contender]:
    builtin = tuple(n for n in names if replicas(n)[0] in POINTSMAN or n in BASELINES)
    extras = tuple(c for c in scenario.extra_contenders if c.name in names)
    wanted = scenario.model_copy(update={"contenders": builtin, "extra_contenders": extras})
    return {c.name: c for c in contenders(wanted, PROFILES, scenario_dir)}


def pick_variant(scenario: Scenario, name: str | None) -> Variant | None:
    if not scenario.variants:
        if name:
            raise SystemExit(f"the scenario has no variants (asked for {name!r})")
        return None
    wanted = name or getattr(scenario, "summary_variant", None) or scenario.variants[0].name
    for variant in scenario.variants:
        if variant.name == wanted:
            return variant
    raise SystemExit(
        f"no variant {wanted!r} (the scenario has {', '.join(v.name for v in scenario.variants)})"
    )


def one_engine(engines: Sequence[EngineConfig]) -> EngineConfig:
    if any(e != engines[0] for e in engines):
        raise SystemExit("the live bench runs one engine config for every pod; this scenario's pods differ")
    return engines[0]


def check_sim_flags(flags: list[str], engine: EngineConfig, speedup: float) -> None:
    """The pods the flags start run exactly the engine the virtual runs scale, at ``speedup``."""
    args = build_parser().parse_args(["--ports", "1", *flags])
    spec = pod_specs(args, [1])[0]
    if spec.engine != engine or spec.speedup != speedup:
        raise SystemExit(f"pointsman-sim {' '.join(flags)} would run {spec.engine}, not {engine}")


def virtual_end(
    scenario: Scenario, contender: Contender, engines: Sequence[EngineConfig], trace: Sequence[TraceRequest]
) -> float:
    router = contender.router(scenario, 0)
    result = run_fleet(engines, trace, router, on_finish=lambda i, _s: router.finished(trace[i]))
    return result.ended_at


def parse_levels(text: str) -> list[float]:
    try:
        levels = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"levels: comma-separated numbers, got {text!r}") from None
    if not levels or any(x <= 0 for x in levels):
        raise argparse.ArgumentTypeError("levels must be positive")
    return levels


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--scenario", type=Path, default=DEFAULT_SCENARIO, help="scenario YAML")
    parser.add_argument(
        "--variant", help="the scenario variant to run (default: its summaryVariant or first)"
    )
    parser.add_argument("--time-scale", type=float, default=20.0, help="k: pods k times slower, rate / k")
    parser.add_argument("--levels", type=parse_levels, default=[0.5], help="fractions of the capacity")
    parser.add_argument(
        "--duration", type=float, default=60.0, help="seconds of counted arrivals per run (wall)"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        help="seconds of arrivals before those, sent but not counted (default: k x 1 s, the fleet's cold "
        "start: every adapter loaded from disk)",
    )
    parser.add_argument("--client", choices=("inference-perf", "builtin"), default="inference-perf")
    parser.add_argument("--contenders", default=",".join(DEFAULT_CONTENDERS), help="comma-separated")
    parser.add_argument("--pods", type=int, help="pods (default: the scenario's)")
    parser.add_argument(
        "--capacity", type=float, help="the reference's capacity, req/s unscaled (skip the search)"
    )
    parser.add_argument("--virtual-seeds", type=int, default=5, help="router seeds per virtual replay")
    parser.add_argument("--output", type=Path, help="json path (default bench/results/live-SCENARIO.json)")
    args = parser.parse_args(argv)
    if args.time_scale <= 0 or args.duration <= 0 or args.virtual_seeds < 1:
        parser.error("--time-scale, --duration and --virtual-seeds must be positive")
    if args.warmup is None:
        args.warmup = WARMUP_UNSCALED_S * args.time_scale
    if args.warmup < 0:
        parser.error("--warmup must not be negative")
    return args


# -- the bench ------------------------------------------------------------------------------------
def log(message: str) -> None:
    print(f"[bench-live {time.strftime('%H:%M:%S')}] {message}", flush=True)


def search_capacities(
    scenario: Scenario, contenders: Sequence[Contender], engines: list[EngineConfig]
) -> tuple[dict[str, Capacity], CapacityMethod]:
    """The contenders' capacities as the quality bench finds them (its search, its runs: the
    scenario's duration and repeats), in virtual time on the unscaled engine."""
    with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
        sweep = Sweep(scenario, contenders, pool, levels=(), duration=scenario.load.duration)
        return sweep.capacities(engines, [c.name for c in contenders]), sweep.method


@dataclass
class ClientChoice:
    """The client the runs use: inference-perf while ``tokenizer`` is set; after inference-perf
    failed once, the builtin client for the rest of the bench (``fallback`` says why)."""

    tokenizer: Path | None
    fallback: str = ""

    @property
    def name(self) -> str:
        return "inference-perf" if self.tokenizer is not None else "builtin"


def live_run(
    args: argparse.Namespace,
    scenario: Scenario,
    contender: LiveContender,
    config: Contender | None,
    sim_flags: list[str],
    trace: list[TraceRequest],
    rate: float,
    here: Path,
    timeout: float,
    tokenizer: Path | None,
    seed: int,
) -> tuple[list[RequestResult], dict[str, Any]]:
    """One live run on fresh processes: the results and the CPU record."""
    with started(
        contender.name, contender.kind, config, contender.policy, scenario.fleet.pods, sim_flags, here
    ) as processes:
        meter = Meter(processes.processes)
        window = PrefixWindow(processes.pods, args.warmup)
        if tokenizer is not None:
            span = args.warmup + args.duration
            args_ = (processes.base_url, scenario, trace, rate, span, tokenizer, here, timeout, seed)
            results, client_cpu = perf_run(*args_)
            return results, meter.stop("inference-perf", client_cpu) | {"prefix_cache": window.stop()}
        results = builtin_run(processes.base_url, scenario, trace, timeout)
        return results, meter.stop("builtin", None) | {"prefix_cache": window.stop()}


def level_runs(
    args: argparse.Namespace,
    scenario: Scenario,
    wanted: list[LiveContender],
    virtual: dict[str, Contender],
    scaled: list[EngineConfig],
    sim_flags: list[str],
    rate: float,
    level: float,
    run_dir: Path,
    client: ClientChoice,
    own_capacity: dict[str, float],
    out: dict[str, Any],
) -> None:
    """Every contender at one level; each run's record goes into ``out`` as soon as it exists."""
    warmup = args.warmup
    trace = build_trace(scenario, rate, warmup + args.duration)
    for i, contender in enumerate(wanted):
        here = run_dir / f"level-{level:g}" / contender.name
        twin = virtual.get(contender.virtual)  # None: a router nothing in virtual time does as
        required = (
            contender.name == scenario.load.reference and REQUIRED_LEVELS[0] <= level <= REQUIRED_LEVELS[1]
        )
        record: dict[str, Any] = {"kind": contender.kind, "virtual_contender": contender.virtual}
        record["required"] = required
        own = own_capacity.get(contender.name)
        if own:
            # The level as a fraction of this contender's own capacity (the reference's is the level).
            record["own_load"] = round(rate * args.time_scale / own, 3)
        out[contender.name] = record
        end = virtual_end(scenario, twin or virtual[scenario.load.reference], scaled, trace)
        timeout = 1.5 * end + 60
        log(
            f"level {level:g} [{i + 1}/{len(wanted)}] {contender.name}: {len(trace)} requests at "
            f"{rate:.2f} req/s live, {client.name}; virtual run ends at {end:.0f} s"
        )
        config = virtual.get(contender.name)

        attempt = functools.partial(live_run, args, scenario, contender, config, sim_flags, trace, rate)
        try:
            try:
                results, cpu = attempt(here, timeout, client.tokenizer, i)
            except ClientFailed as exc:
                if client.tokenizer is None:
                    raise
                client.tokenizer = None
                client.fallback = (
                    f"inference-perf failed at level {level:g} {contender.name}, so the builtin client ran "
                    f"from there on: {str(exc).splitlines()[0]} (log: {here / 'inference-perf.log'})"
                )
                log(f"  {client.fallback}")
                results, cpu = attempt(here / "builtin", timeout, None, i)
        except Exception as exc:
            record["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
            log(f"  failed: {record['error']}")
            continue
        record["client"] = client.name
        record["prefix_cache"] = cpu.pop("prefix_cache", None)
        record["cpu"] = cpu
        stats = live_stats(rate, trace, results, warmup)
        record["live"] = stats.as_dict()
        record["send_lag_ms"] = send_lag(trace, results)
        errors = sorted({r.error for r in results if not r.ok and r.error})
        if errors:
            record["live_errors"] = errors[:5]
        hits = (record["prefix_cache"] or {}).get("hit_rate")
        if twin is None:
            log(
                f"  live TTFT p50 {stats.ttft_p50_s:.3f} p90 {stats.ttft_p90_s:.3f} s (no virtual twin); "
                f"prefix hit rate {hits}; {stats.finished}/{stats.requests} finished; ours "
                f"{cpu['ours_cores']} cores, machine {cpu['machine_cores']}"
            )
            continue
        replayed, matched = (
            as_sent(trace, results, scenario.traffic.base_model)
            if record["client"] == "inference-perf"
            else (trace, len(trace))
        )
        record["virtual_matched_requests"] = matched
        runs: list[RunStats] = [
            virtual_run(scenario, twin, scaled, replayed, rate, seed, since=warmup)
            for seed in range(args.virtual_seeds)
        ]
        median = median_stats(runs)
        record["virtual"] = {k: round(v, 6) for k, v in median.items()}
        record["virtual_range"] = {
            name: [
                round(min(getattr(r, name) for r in runs), 6),
                round(max(getattr(r, name) for r in runs), 6),
            ]
            for name in COMPARED_METRICS
        }
        record["agreement"] = agreement(stats, median)
        if warmup > 0:
            # The same comparison with the warm-up's requests counted too: the cold start (every
            # adapter loaded from disk, k times slower) is what dominates those.
            everything = live_stats(rate, trace, results)
            runs_all = [
                virtual_run(scenario, twin, scaled, replayed, rate, seed)
                for seed in range(args.virtual_seeds)
            ]
            median_all = median_stats(runs_all)
            record["with_warmup"] = {
                "live": everything.as_dict(),
                "virtual": {k: round(v, 6) for k, v in median_all.items()},
                "virtual_range": {
                    name: [min(getattr(r, name) for r in runs_all), max(getattr(r, name) for r in runs_all)]
                    for name in AGREEMENT_METRICS
                },
                "agreement": agreement(everything, median_all),
            }
        record["in_seed_range"] = {
            name: lo <= getattr(stats, name) <= hi
            for name, (lo, hi) in record["virtual_range"].items()
            if name in AGREEMENT_METRICS
        }
        if contender.kind == "pointsman":
            stale = [
                virtual_run(scenario, twin, scaled, replayed, rate, seed, STALE_SNAPSHOT_S, warmup)
                for seed in range(args.virtual_seeds)
            ]
            stale_median = median_stats(stale)
            record["virtual_stale"] = {
                "snapshot_interval_s": STALE_SNAPSHOT_S,
                **{name: round(stale_median[name], 6) for name in AGREEMENT_METRICS},
                "ratios": agreement(stats, stale_median)["ratios"],
            }
        ratios = record["agreement"]["ratios"]
        log(
            f"  live TTFT p50 {stats.ttft_p50_s:.3f} p90 {stats.ttft_p90_s:.3f} s, virtual "
            f"{median['ttft_p50_s']:.3f} / {median['ttft_p90_s']:.3f} s: ratios "
            f"{ratios['ttft_p50_s'] or 0:.2f} / {ratios['ttft_p90_s'] or 0:.2f}; prefix hit rate {hits} "
            f"live, {median.get('prefix_hit_rate')} virtual; {stats.finished}/"
            f"{stats.requests} finished; ours {cpu['ours_cores']} cores, machine {cpu['machine_cores']}"
            + (" (disturbed)" if cpu["disturbed"] else "")
        )


def machine_note(levels: list[dict[str, Any]]) -> dict[str, Any]:
    disturbed, saturated, most = [], [], 0.0
    for level in levels:
        for name, record in level["contenders"].items():
            cpu = record.get("cpu")
            if not cpu:
                continue
            most = max(most, cpu["ours_cores"])
            where = f"level {level['level']:g} {name}"
            if cpu["disturbed"]:
                disturbed.append(f"{where} ({cpu['rest_of_machine_cores']} cores by others)")
            if cpu["saturated"]:
                saturated.append(f"{where} (machine {cpu['machine_cores']} cores)")
    cpus = psutil.cpu_count() or 1
    parts = [f"{cpus} cores; the live processes used at most {most:.2f} cores in a run."]
    parts.append(
        f"Disturbed (others used more than {BUSY_CORES} core): {', '.join(disturbed)}."
        if disturbed
        else "Not disturbed."
    )
    if saturated:
        parts.append(f"CPU saturated (> {MACHINE_SATURATED:.0%} of the machine): {', '.join(saturated)}.")
    return {
        "cpus": cpus,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "disturbed_runs": disturbed,
        "saturated_runs": saturated,
        "note": " ".join(parts),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    # SIGTERM as Ctrl-C: the finally blocks stop every process this bench started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if not args.scenario.is_file():
        raise SystemExit(f"no scenario file {args.scenario} (give one with --scenario)")
    loaded = load_scenario(args.scenario)
    scenario = live_scenario(loaded, args.pods)
    variant = pick_variant(scenario, args.variant)
    engines = engine_configs(scenario, variant)
    engine = one_engine(engines)
    k = args.time_scale
    scaled = [time_scaled(e, k) for e in engines]
    wanted = resolve_contenders([n for n in args.contenders.split(",") if n], scenario)
    reference = scenario.load.reference
    virtual = virtual_contenders(scenario, {c.virtual for c in wanted} | {reference}, args.scenario.parent)
    adapters = ModelMix.of(scenario.traffic).adapters
    sim_flags = sim_args(
        engine,
        profile=scenario.fleet.profile,
        model=scenario.traffic.base_model,
        adapters=adapters,
        speedup=1 / k,
    )
    check_sim_flags(sim_flags, engine, 1 / k)

    if args.capacity is not None:
        # Given: no search, and no other contender's own capacity.
        capacity, capacity_source, own = args.capacity, "--capacity", {reference: args.capacity}
    else:
        # The reference's capacity, and each other Pointsman contender's own: what a level means for it.
        names = dict.fromkeys([reference, *(c.name for c in wanted if c.kind == "pointsman")])
        log(f"searching the capacities of {', '.join(names)} in virtual time (unscaled engine)")
        found, method = search_capacities(scenario, [virtual[name] for name in names], engines)
        own = {name: cap.rate for name, cap in found.items()}
        capacity = own[reference]
        capacity_source = f"virtual search, {len(found[reference].probes)} probes: {method.text()}"
        for name, rate in own.items():
            log(f"{name} capacity {rate:.1f} req/s unscaled")
    log(f"{reference} capacity {capacity:.1f} req/s unscaled; k = {k:g}")

    run_dir = ROOT / ".run" / time.strftime(f"live-%Y%m%d-%H%M%S-{os.getpid()}")
    run_dir.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    client = ClientChoice(None)
    if args.client == "inference-perf" and scenario.traffic.prompts is not None:
        client.fallback = (
            "the builtin client ran: the scenario's prompts share prefixes "
            f"({scenario.traffic.prompts.kind}), "
            "which inference-perf's trace replay cannot send (its shared-prefix generator draws prompts and "
            "times of its own, which no virtual replay could follow)"
        )
        log(client.fallback)
    elif args.client == "inference-perf":
        try:
            client.tokenizer = build_tokenizer(run_dir)
        except ClientFailed as exc:
            client.fallback = (
                f"inference-perf cannot run here, so the builtin client ran: {str(exc).splitlines()[0]}"
            )
            notes.append(str(exc)[:2000])
            log(client.fallback)
    first_client = client.name

    levels: list[dict[str, Any]] = []
    try:
        for level in args.levels:
            rate = level * capacity / k
            runs: dict[str, Any] = {}
            levels.append({"level": level, "rate_live": rate, "rate_unscaled": rate * k, "contenders": runs})
            level_runs(
                args, scenario, wanted, virtual, scaled, sim_flags, rate, level, run_dir, client, own, runs
            )
    except KeyboardInterrupt:
        notes.append("interrupted (Ctrl-C): only the runs that finished are reported")
        log("interrupted: writing what ran")

    used = sorted({r["client"] for lv in levels for r in lv["contenders"].values() if "client" in r})
    client_name = " then ".join(used) if len(used) > 1 else (used[0] if used else first_client)
    if client.fallback:
        client_note = client.fallback
    elif client_name == "inference-perf":
        client_note = (
            "inference-perf 0.7.0 (.venv-perf): trace_replay of the scenario's arrivals and lengths, each "
            "request's adapter by lora_traffic_split, streaming completions, an offline tokenizer"
        )
    else:
        client_note = "the bench's own open-loop client (bench/live_client.py), chosen with --client builtin"

    result: dict[str, Any] = {
        "percentile_rule": PERCENTILE_RULE,
        "scenario": scenario.name,
        "scenario_file": str(args.scenario),
        "variant": variant.name if variant else "",
        "client": client_name,
        "client_note": client_note,
        "setup": {
            "time_scale": k,
            "pods": scenario.fleet.pods,
            "profile": scenario.fleet.profile,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "reference": reference,
            "capacity_rps": capacity,
            "capacity_source": capacity_source,
            "own_capacity_rps": own,
            "levels": args.levels,
            "virtual_seeds": args.virtual_seeds,
            "required": (
                f"p50 and p90 TTFT of {reference} (the picker's default profile), live / virtual median "
                f"within {TOLERANCE:.0%}, at levels {REQUIRED_LEVELS[0]:g}-{REQUIRED_LEVELS[1]:g} of "
                "its capacity; the other contenders' agreement is shown for what it tells"
            ),
            "sim_flags": sim_flags,
        },
        "machine": machine_note(levels),
        "levels": levels,
        "notes": notes,
        "run_dir": str(run_dir.relative_to(ROOT)),
        "bench_seconds": round(time.perf_counter() - began),
    }
    output = args.output or RESULTS / f"live-{scenario.name}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    output.with_suffix(".md").write_text(live_report.markdown(result), encoding="utf-8")
    log(f"wrote {output} and {output.with_suffix('.md').name}; logs in {run_dir}")
    failed = [
        f"level {lv['level']:g} {name}"
        for lv in levels
        for name, r in lv["contenders"].items()
        if r["required"] and not (r.get("agreement") or {}).get("agrees")
    ]
    if failed:
        log(f"live and virtual do not agree (required): {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
