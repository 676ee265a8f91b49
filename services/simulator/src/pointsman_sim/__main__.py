"""``pointsman-sim``: simulated vLLM pods, one per port, all in one process.

Flags follow vLLM's names where vLLM has one::

    pointsman-sim --ports 8001,8002,8003 --adapters tweet-summary-0,tweet-summary-1,sql-lora --max-loras 2

The engine's constants come from ``--profile`` (a GPU, a model and a vLLM version); the vLLM-named
flags override the profile's value where given.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence

from pointsman_shared import aio, cli
from pointsman_shared.config import TracingConfig, tracing_env
from pointsman_shared.tracing import build_tracing
from pointsman_sim.metrics import LORA_LABEL_SEMANTICS, METRICS_VERSIONS
from pointsman_sim.pod import DEFAULT_MODEL, PodSpec, SimPod
from pointsman_sim.profiles import DEFAULT_PROFILE, ProfileError, load_profile, profile_names
from pointsman_sim.servers import bind, serve_pods

logger = logging.getLogger("pointsman_sim")


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _ports(text: str) -> list[int]:
    try:
        ports = [int(part) for part in _names(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated port numbers, got {text!r}") from None
    if not ports or any(not 0 <= port <= 65535 for port in ports) or len(set(ports)) != len(ports):
        raise argparse.ArgumentTypeError(f"expected distinct port numbers 0-65535, got {text!r}")
    return ports


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pointsman-sim",
        description="Simulated vLLM pods: OpenAI API, vLLM /metrics, continuous batching with LoRA slots.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    ports = parser.add_mutually_exclusive_group()
    ports.add_argument("--ports", type=_ports, help="comma-separated ports, one pod per port")
    ports.add_argument("--port", type=int, help="a single pod's port (default 8000)")
    parser.add_argument(
        "--pod-names",
        type=_names,
        help="comma-separated names for the x-pointsman-pod header, one per port (default host:port)",
    )
    parser.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        choices=profile_names(),
        help="engine constants: GPU, model and vLLM version (default %(default)s)",
    )
    parser.add_argument("--model", help="base model name (default: the profile's)")
    parser.add_argument("--adapters", type=_names, default=[], help="comma-separated LoRA adapter names")
    parser.add_argument(
        "--lora-modules",
        nargs="+",
        default=[],
        metavar="NAME[=PATH]",
        help="LoRA adapters the vLLM way (paths are ignored); adds to --adapters",
    )
    for flag, what in (
        ("--max-loras", "adapters in GPU slots"),
        ("--max-cpu-loras", "adapters in the CPU cache"),
        ("--max-num-seqs", "requests in a batch"),
        ("--max-num-batched-tokens", "tokens computed per step"),
        ("--num-gpu-blocks-override", "KV-cache blocks of 16 tokens"),
        ("--max-model-len", "context length"),
    ):
        parser.add_argument(flag, type=int, help=f"{what} (default: the profile's)")
    parser.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        help="automatic prefix caching (default: the profile's; vLLM V1 has it on, V0 off)",
    )
    parser.add_argument(
        "--metrics-version",
        default="current",
        choices=METRICS_VERSIONS,
        help="v0: the old metric names such as vllm:gpu_cache_usage_perc (default %(default)s)",
    )
    parser.add_argument(
        "--lora-info-labels",
        default="v0",
        choices=LORA_LABEL_SEMANTICS,
        help="vllm:lora_requests_info labels. v0: running and waiting adapters apart; current: "
        "both labels list every active adapter (default %(default)s)",
    )
    parser.add_argument(
        "--speedup",
        type=_positive(float),
        default=1.0,
        help="divide every simulated duration by this, for fast tests (default %(default)s)",
    )
    parser.add_argument(
        "--otlp-traces-endpoint",
        help="send a span per request over OTLP here, as vLLM's flag (grpc unless "
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf; the other OTEL_* variables apply too)",
    )
    cli.add_common_flags(parser, distribution="pointsman-sim", log_level="warning")
    return parser


def requested_ports(args: argparse.Namespace) -> list[int]:
    return args.ports or [args.port if args.port is not None else 8000]


def pod_specs(args: argparse.Namespace, ports: Sequence[int]) -> list[PodSpec]:
    """One pod spec per port; raises ``ValueError`` for arguments that do not fit together."""
    names: list[str] = args.pod_names or [f"{args.host}:{port}" for port in ports]
    if len(names) != len(ports):
        raise ValueError(f"--pod-names has {len(names)} names for {len(ports)} ports")
    adapters = [
        *args.adapters,
        *(name for module in args.lora_modules for name in _lora_module_names(module)),
    ]
    try:
        profile = load_profile(args.profile)
    except ProfileError as exc:
        raise ValueError(str(exc)) from exc
    overrides = {
        "num_gpu_blocks": args.num_gpu_blocks_override,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_loras": args.max_loras,
        "max_cpu_loras": args.max_cpu_loras,
        "max_model_len": args.max_model_len,
        "enable_prefix_caching": args.enable_prefix_caching,
    }
    engine = dataclasses.replace(profile.engine, **{k: v for k, v in overrides.items() if v is not None})
    if args.max_cpu_loras is None and engine.max_cpu_loras is not None:
        # A profile's CPU cache smaller than the --max-loras asked for grows with it, as vLLM's does.
        engine = dataclasses.replace(engine, max_cpu_loras=max(engine.max_cpu_loras, engine.max_loras))
    return [
        PodSpec(
            name=name,
            model=args.model or profile.model or DEFAULT_MODEL,
            adapters=tuple(adapters),
            engine=engine,
            speedup=args.speedup,
            metrics_version=args.metrics_version,
            lora_info_labels=args.lora_info_labels,
        )
        for name in names
    ]


def _lora_module_names(module: str) -> list[str]:
    # vLLM takes `name=path`; a bare name is accepted too, and commas as in --adapters.
    return [part.split("=", 1)[0].strip() for part in _names(module)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    ports = requested_ports(args)
    try:
        pod_specs(args, ports)  # fail on bad arguments before binding anything
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    sockets = []
    for port in ports:
        try:
            sockets.append(bind(args.host, port))
        except OSError as exc:
            for sock in sockets:
                sock.close()
            print(f"pointsman-sim: cannot listen on {args.host}:{port}: {exc}", file=sys.stderr)
            return 1
    # Port 0 picks a free port: name the pod by the port it got.
    specs = pod_specs(args, [sock.getsockname()[1] for sock in sockets])
    pods = [SimPod(spec) for spec in specs]
    logger.info("serving %s", ", ".join(f"{pod.name} ({pod.spec.model})" for pod in pods))
    tracing = None
    if args.otlp_traces_endpoint:
        tracing = build_tracing(tracing_config(args.otlp_traces_endpoint, os.environ), "pointsman-sim")
    aio.run(serve_pods(pods, sockets, log_level=args.log_level, tracing=tracing))
    return 0


def tracing_config(endpoint: str, environ: Mapping[str, str]) -> TracingConfig:
    """vLLM's tracing: every request with a sampled parent, and every one without (the SDK's default
    sampler, parentbased_always_on), unless OTEL_TRACES_SAMPLER says otherwise; the flag's endpoint."""
    found = tracing_env(environ, "grpc")
    doc = {"sampler": "parentbased_always_on", "enabled": True, **found, "endpoint": endpoint}
    return TracingConfig.model_validate(doc)


if __name__ == "__main__":
    sys.exit(main())
