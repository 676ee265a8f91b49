"""What the Lua usage filter (deploy/envoy/usage.lua) costs Envoy per streamed event: Envoy alone in
front of the SSE pods, without and with the filter, in turn for ``--rounds`` rounds so both see the
machine alike (the streamed workload of ``bench/picker.py``: 40 connections of 200-token completions
with usage, an event every 10 ms).

    .venv/bin/python bench/lua_cost.py [--rounds 3] [--seconds 10]

Prints each run's Envoy CPU per event and the medians; the difference is the filter's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path

from picker import (
    PLAIN,
    PLAIN_MODEL,
    Bench,
    Load,
    Meter,
    alone_bootstrap,
    start_envoy,
    start_sse_pods,
    streamed_body,
    wait_completion,
)

from pointsman_devstack.ports import free_port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--pods", type=int, default=3)
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="bench-lua-"))
    ports = [free_port() for _ in range(args.pods)]
    pods = start_sse_pods(ports, run_dir)
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    runs: dict[str, list[float]] = {"envoy_alone": [], "envoy_alone_lua": []}
    try:
        bench = Bench(run_dir, Load(run_dir, 16), 0.0, args.seconds, pods)
        body = streamed_body(PLAIN_MODEL)
        for _ in range(args.rounds):
            for name, lua in (("envoy_alone", False), ("envoy_alone_lua", True)):
                doc, port = alone_bootstrap(ports, lua=lua)
                envoy = start_envoy(doc, name, run_dir)
                try:
                    wait_completion(envoy, port, PLAIN)
                    result = bench.streamed(port, body, Meter({"envoy": envoy.pid, "backend": pods.pid}))
                    runs[name].append(result["cpu_us_per_event"]["envoy"])
                finally:
                    envoy.stop(5)
    finally:
        pods.stop(5)
        shutil.rmtree(run_dir, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in runs.items()}
    print(
        json.dumps(
            {
                "envoy_cpu_us_per_event": runs,
                "medians": medians,
                "lua_adds_us_per_event": round(medians["envoy_alone_lua"] - medians["envoy_alone"], 2),
                "load_average": {"start": load_at_start, "end": [round(x, 2) for x in os.getloadavg()]},
            }
        )
    )


if __name__ == "__main__":
    main()
