"""The shipped mode's latency at a fixed rate, round after round beside Envoy alone (issue #21's tail).

``bench/picker.py`` measures each setup once; a p99 over 2,500 requests on a shared 2-core machine
moves by several milliseconds from one run to the next, so a change to the picker is judged here by
rounds taken in turn: every round runs each setup for ``--seconds`` at ``--rate`` (the order reversed
every other round), the load average read before each run. Setups: ``alone`` (Envoy without
ext_proc), and the picker behind its own Envoy in a mode of ``bench/picker.py`` (``shipped``,
``buffered``, ``headers_only``, ``requests_only``, ``early_body``), this tree's picker package or, with
``@before``, ``--against``'s (``shipped@before``).

Per run: p50 / p99 / p99.9 from each request's send, how late the client sent (``send_lag_p99_ms``),
the connections it opened, each process's CPU in cores and its run-queue wait (``/proc/PID/task/*/
schedstat``: time runnable but not running, per wakeup and in total), the client's own GC passes, and
with ``--probe`` what the picker recorded (``bench/tail_probe``: its GC passes, its event loop's
lateness, its slow reads, snapshot refreshes). ``--raw`` keeps every request's send time and
latency (the monotonic clock the probe uses too), to line the slow requests up with the probe's
events. Writes JSON (``--output``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import picker as bench

from pointsman_devstack.ports import free_port
from pointsman_shared import aio
from pointsman_shared.stats import percentile

PROBE = Path(__file__).parent / "tail_probe"
MODES = {s.name: s for s in bench.SETUPS}


def schedstat(pid: int) -> tuple[float, float, int]:
    """CPU seconds, seconds runnable but waiting for a CPU, and timeslices, over all threads."""
    cpu = wait = 0.0
    slices = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            run, delay, count = (int(x) for x in (task / "schedstat").read_text().split())
        except (OSError, ValueError):
            continue
        cpu += run / 1e9
        wait += delay / 1e9
        slices += count
    return cpu, wait, slices


async def fixed_rate(port: int, body: bytes, rate: float, seconds: float) -> dict[str, Any]:
    """``bench.fixed_rate`` on the probe's clock (monotonic), with each request's send time and latency."""
    result = await bench.fixed_rate(port, body, rate, seconds, clock=time.monotonic, raw=True)
    pairs = result.pop("raw")
    latencies = [latency for _, latency in pairs]
    return {
        **result,
        "p999_ms": bench._ms(percentile(latencies, 0.999)),
        "max_ms": bench._ms(max(latencies)),
        "raw": [(round(sent, 6), round(latency * 1e3, 3)) for sent, latency in pairs],
    }


class ClientGc:
    """The client's own GC passes during a run (a pass in the client delays what it measures)."""

    def __init__(self) -> None:
        self.passes: list[tuple[float, int, float]] = []
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.monotonic()
        else:
            self.passes.append((self._began, info["generation"], (time.monotonic() - self._began) * 1e3))


def measure(port: int, body: bytes, pids: dict[str, int], args: argparse.Namespace) -> dict[str, Any]:
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    pids = {**pids, "client": os.getpid()}
    before = {name: schedstat(pid) for name, pid in pids.items()}
    client_gc = ClientGc()
    gc.callbacks.append(client_gc)
    machine = bench.machine_busy_seconds()
    began = time.monotonic()
    try:
        with bench.no_gc() if args.client_gc == "off" else contextlib.nullcontext():
            result = aio.run(fixed_rate(port, body, args.rate, args.seconds))
    finally:
        gc.callbacks.remove(client_gc)
    wall = time.monotonic() - began
    busy = bench.machine_busy_seconds() - machine
    processes = {}
    for name, pid in pids.items():
        cpu, wait, slices = (b - a for b, a in zip(schedstat(pid), before[name], strict=True))
        processes[name] = {
            "cores": round(cpu / wall, 3),
            "runqueue_wait_ms": round(wait * 1e3, 1),
            "wait_us_per_slice": round(wait / max(1, slices) * 1e6, 1),
            "slices": slices,
        }
    measured = sum(p["cores"] for p in processes.values()) * wall
    result.update(
        # Busy CPU none of the measured processes explain: others' work (tick-sampled, rough).
        others_cores=round((busy - measured) / wall, 2),
        uptime=uptime,
        pids=pids,
        began=round(began, 6),
        processes=processes,
        client_gc=[(round(t, 6), g, round(ms, 3)) for t, g, ms in client_gc.passes],
    )
    if not args.raw:
        slow = sorted(result["raw"], key=lambda r: -r[1])[: max(1, len(result["raw"]) // 100)]
        result["raw"] = sorted(slow)  # the slowest 1%, by send time
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pods", type=int, default=3)
    parser.add_argument(
        "--setups", default="alone,shipped", help="alone, and picker modes (shipped, buffered, ...; @before)"
    )
    parser.add_argument("--against", type=Path, help="the tree @before setups run the picker package of")
    parser.add_argument("--probe", action="store_true", help="the pickers record GC, loop lag, slow reads")
    parser.add_argument("--raw", action="store_true", help="keep every request's send time and latency")
    parser.add_argument(
        "--client-gc", choices=("on", "off"), default="off", help="the client's cyclic GC during a run"
    )
    parser.add_argument("--output", type=Path, default=Path("tail.json"))
    args = parser.parse_args()
    setups = [s for s in args.setups.split(",") if s]
    for setup in setups:
        mode, _, tree = setup.partition("@")
        if (mode != "alone" and mode not in MODES) or (tree and args.against is None):
            parser.error(f"--setups: {setup}?")

    run_dir = Path(tempfile.mkdtemp(prefix="bench-tail-"))
    pods = [free_port() for _ in range(args.pods)]
    backend = bench.start_envoy(bench.backend_bootstrap(pods, free_port()), "backend", run_dir)
    started: list[Any] = []
    targets: dict[str, tuple[int, bytes, dict[str, int]]] = {}
    probes: dict[str, Path] = {}
    stack = None
    try:
        if "alone" in setups:
            doc, port = bench.alone_bootstrap(pods)
            alone = bench.start_envoy(doc, "envoy-alone", run_dir)
            started.append(alone)
            bench.wait_completion(alone, port, bench.PLAIN)
            targets["alone"] = (port, bench.PLAIN, {"envoy": alone.pid, "backend": backend.pid})
        stack = bench.Pickers(pods, run_dir, args.against)
        for setup in setups:
            if setup == "alone":
                continue
            mode, _, tree = setup.partition("@")
            env = None
            name = f"picker-{setup.replace('@', '-')}"
            if args.probe:
                probes[setup] = run_dir / f"{name}-probe.json"
                env = {"PYTHONPATH": str(PROBE), "TAIL_PROBE": str(probes[setup])}
            process, ext_proc = stack.start_picker(name, "native@before" if tree else "native", env=env)
            doc, port = MODES[mode].bootstrap([ext_proc])
            proxy = bench.start_envoy(doc, f"envoy-{name}", run_dir)
            started.append(proxy)
            bench.wait_completion(proxy, port, bench.REWRITTEN)
            pids = {"picker": process.pid, "envoy": proxy.pid, "backend": backend.pid}
            pids |= {"collector": stack.collector.pid, "redis": stack.redis.pid} if stack.redis.pid else {}
            targets[setup] = (port, bench.REWRITTEN, pids)
        for port, body, _ in targets.values():  # warm-up: connections, the first streams
            aio.run(fixed_rate(port, body, args.rate, 1.0))
        rounds: list[dict[str, Any]] = []
        for r in range(args.rounds):
            order = setups if r % 2 == 0 else setups[::-1]
            rounds.append({setup: measure(*targets[setup], args) for setup in order})
            print(
                f"round {r + 1}: "
                + "; ".join(
                    f"{s} {v['p50_ms']} / {v['p99_ms']} ms (lag {v['send_lag_p99_ms']}, "
                    f"others {v['others_cores']} cores)"
                    for s, v in rounds[-1].items()
                )
                + f"; {rounds[-1][order[0]]['uptime'].split('load average:')[-1].strip()}",
                flush=True,
            )
    finally:
        if stack is not None:
            stack.stop()  # the pickers' probes are written as they exit
        for process in started:
            process.stop(5)
        backend.stop(5)
    out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "rounds": rounds}
    out["probes"] = {s: json.loads(p.read_text()) for s, p in probes.items() if p.is_file()}
    args.output.write_text(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
