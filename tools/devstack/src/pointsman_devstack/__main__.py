"""``pointsman-stack``: run the local stack in the foreground until Ctrl-C, SIGTERM or SIGHUP.

Stop signals: :mod:`pointsman_devstack.signals`. The children die with this process if it is killed:
:mod:`pointsman_devstack.lifeline`. Their PIDs are in ``<run dir>/pids.json``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import TextIO

from pointsman_devstack import envoy
from pointsman_devstack.envoy import EnvoyNotFound
from pointsman_devstack.errors import StackCancelled, StackError
from pointsman_devstack.ports import free_port
from pointsman_devstack.redis_server import RedisUnavailable
from pointsman_devstack.signals import StopSignals
from pointsman_devstack.stack import SimOptions, Stack, StackOptions, StackPorts, default_run_dir
from pointsman_shared.config import ConfigError, PointsmanConfig, load_config

# How often the running stack looks for a stop signal and for a process that died on its own.
WATCH_INTERVAL = 0.1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pointsman-stack",
        description="Start Redis, simulator pods, collector, picker and Envoy; Ctrl-C stops them all.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {metadata.version('pointsman-devstack')}"
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=Path("config/local.yaml"),
        help="a PointsmanConfig file, relative to the working directory (default %(default)s)",
    )
    parser.add_argument(
        "--gateway-port",
        type=int,
        default=envoy.DEFAULT_GATEWAY_PORT,
        help="where Envoy takes requests (default %(default)s)",
    )
    parser.add_argument(
        "--admin-port",
        type=int,
        default=envoy.DEFAULT_ADMIN_PORT,
        help="Envoy's admin port (default %(default)s)",
    )
    parser.add_argument(
        "--run-dir", type=Path, help="where the logs and derived configs go (default .run/...)"
    )
    parser.add_argument("--model", help="the base model the pods serve (default: from the config)")
    parser.add_argument(
        "--adapters", help="comma-separated LoRA adapters the pods serve (default: the config's targets)"
    )
    parser.add_argument(
        "--max-loras", type=int, default=2, help="adapter slots per pod (default %(default)s)"
    )
    parser.add_argument("--max-num-seqs", type=int, help="running requests per pod (simulator default)")
    parser.add_argument(
        "--speedup",
        type=float,
        help="simulated time runs this many times faster (default: the simulator's, 1)",
    )
    parser.add_argument(
        "--pickers",
        type=int,
        default=1,
        help="picker replicas behind Envoy (default %(default)s; more than one: free ports)",
    )
    parser.add_argument("--no-docker", action="store_true", help="never start Redis in a container")
    parser.add_argument("--quiet", action="store_true", help="only the log files get the processes' output")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = load_config(args.config, environ={})
        sim = SimOptions.for_config(
            config,
            model=args.model,
            adapters=[a.strip() for a in args.adapters.split(",") if a.strip()] if args.adapters else None,
            max_loras=args.max_loras,
            max_num_seqs=args.max_num_seqs,
            speedup=args.speedup,
        )
        if args.pickers < 1:
            raise StackError("--pickers: at least one picker")
        ports = StackPorts.from_config(config, gateway=args.gateway_port, envoy_admin=args.admin_port)
        # The first replica listens where the config says; the others on free ports.
        more = tuple((free_port(), free_port(), free_port()) for _ in range(args.pickers - 1))
        ports = replace(ports, more_pickers=more)
        options = StackOptions(
            config_path=args.config,
            run_dir=args.run_dir or default_run_dir(),
            ports=ports,
            sim=sim,
            allow_docker=not args.no_docker,
        )
        stack = Stack(options, echo=None if args.quiet else _Console(sys.stdout).line)
    except (ConfigError, StackError) as exc:
        print(f"pointsman-stack: {exc}", file=sys.stderr)
        return 2

    # Installed once, before the first child starts, kept until the last one stopped: a signal at any
    # moment only sets a flag the stack polls, so no signal can cut a start or a stop short.
    with StopSignals(stack) as signals:
        return _run(stack, config, signals)


def _run(stack: Stack, config: PointsmanConfig, signals: StopSignals) -> int:
    try:
        try:
            stack.start()
            print(_banner(stack, config), flush=True)
            # Wake up now and then to notice a stop signal or a process that died on its own.
            while not stack.cancelled:
                time.sleep(WATCH_INTERVAL)
                stack.check()
        except StackCancelled:
            pass
        name = signal.Signals(signals.received).name if signals.received else "a stop"
        print(f"\npointsman-stack: {name}: stopping", file=sys.stderr, flush=True)
        code = 0
    except (StackError, RedisUnavailable, EnvoyNotFound) as exc:
        print(f"pointsman-stack: {exc}", file=sys.stderr, flush=True)
        code = 1
    finally:
        stack.stop()
    return code


class _Console:
    """Prefixes each process's lines with its name; one lock so lines from threads do not interleave."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._lock = threading.Lock()

    def line(self, name: str, text: str) -> None:
        with self._lock:
            self._out.write(f"{name:>9} | {text}\n")
            self._out.flush()


def _banner(stack: Stack, config: PointsmanConfig) -> str:
    rows = "\n".join(f"  {name:<16} 127.0.0.1:{port}" for name, port in stack.ports.table())
    model = _sample_model(config, stack.sim)
    body = json.dumps(
        {"model": model, "prompt": "Summarize: the gateway routes by adapter.", "max_tokens": 20}
    )
    headers = "-H 'content-type: application/json'"
    curl = f"curl -sS -i {stack.gateway_url}/v1/completions {headers} -d {shlex.quote(body)}"
    return (
        f"\nPointsman local stack is up: {stack.gateway_url}\n\n"
        f"{rows}\n  redis            {stack.redis_url}\n\n"
        f"  pods             {', '.join(stack.pod_addresses)} ({stack.sim.model}; adapters "
        f"{', '.join(stack.sim.adapters) or 'none'})\n"
        f"  pool state       curl -s {stack.collector_url}/v1/pool\n"
        f"  logs             {stack.run_dir}/\n\n"
        f"Try (the x-pointsman-pod response header names the pod that answered):\n  {curl}\n\n"
        "Ctrl-C stops everything.\n"
    )


def _sample_model(config: PointsmanConfig, sim: SimOptions) -> str:
    """A model name that resolves to an adapter, so the sample shows LoRA routing."""
    for model in config.models:
        if any(t.name in sim.adapters for t in model.target_models):
            return model.model_name
    return sim.model


if __name__ == "__main__":
    sys.exit(main())
