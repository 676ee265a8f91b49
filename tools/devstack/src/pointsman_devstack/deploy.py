"""Envoy bootstraps for deployments: the local stack's, with the pickers found by name.

Containers get DNS names and no fixed loopback address, so the picker cluster is STRICT_DNS over the
pickers' names (``envoy --mode validate`` needs no resolution for that), and Envoy listens on every
interface of its container. Everything else — ext_proc, ORIGINAL_DST, the header removal — is exactly
what ``pointsman_devstack.envoy`` renders for the local stack. Two variants are checked in:

- ``deploy/envoy/envoy-compose.yaml`` (``docker-compose.yaml``): two picker replicas by service name;
  ``deploy/envoy/envoy-compose-tracing.yaml`` the same with the OpenTelemetry tracer exporting to the
  ``jaeger`` service (``deploy/compose/tracing.yaml``, ``--variant compose-tracing``);
- ``deploy/k8s/overlays/standalone-envoy/envoy.yaml``: the picker Service, over TLS verified against the
  CA in the ``pointsman-picker-tls`` Secret, presenting the gateway's client certificate (the
  ``pointsman-gateway-tls`` Secret) to a picker that requires one (``--variant kubernetes``);
  ``deploy/k8s/components/standalone-envoy-tracing/envoy-tracing.yaml`` the same with the
  OpenTelemetry tracer exporting to ``otel-collector.observability:4317`` (``--variant
  kubernetes-tracing``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pointsman_devstack import envoy
from pointsman_shared.config import PointsmanConfig, join_host_port, load_config, split_host_port

# The service names of the picker replicas in docker-compose.yaml.
COMPOSE_PICKERS = ("picker-1", "picker-2")
# The picker Service in deploy/k8s/base, and where the standalone Envoy mounts its TLS Secret.
KUBERNETES_PICKER = "pointsman-picker.pointsman.svc.cluster.local"
KUBERNETES_PICKER_PORT = 9002
KUBERNETES_TLS_DIR = "/etc/pointsman/tls"
# The trace viewer of deploy/compose/tracing.yaml: Jaeger all-in-one, taking OTLP/gRPC on 4317.
COMPOSE_OTLP_ENDPOINT = "http://jaeger:4317"
# The OTLP receiver deploy/k8s/components/tracing and standalone-envoy-tracing export to, and the share of
# requests without a trace context they sample.
KUBERNETES_OTLP_ENDPOINT = "http://otel-collector.observability:4317"
KUBERNETES_SAMPLING_PERCENT = 10.0
_UPSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"


def compose_options(config: PointsmanConfig, pickers: Sequence[str] = COMPOSE_PICKERS) -> envoy.EnvoyOptions:
    """Envoy on every interface, one picker endpoint per replica name at the config's ext_proc port."""
    port = split_host_port(config.picker.listen)[1]
    options = envoy.EnvoyOptions.from_config(
        config,
        gateway_listen=join_host_port("0.0.0.0", envoy.DEFAULT_GATEWAY_PORT),
        admin_listen=join_host_port("0.0.0.0", envoy.DEFAULT_ADMIN_PORT),
    )
    return dataclasses.replace(options, pickers=tuple(join_host_port(name, port) for name in pickers))


def compose_bootstrap(options: envoy.EnvoyOptions, *, tls_dir: str | None = None) -> dict[str, Any]:
    """``options``' bootstrap with a STRICT_DNS picker cluster; with ``tls_dir``, TLS to the pickers,
    verified against ``tls_dir``/ca.crt for the name Envoy dials, with ``tls_dir``/gateway.crt and
    gateway.key as the client certificate."""
    doc = envoy.bootstrap(options)
    for cluster in doc["static_resources"]["clusters"]:
        if cluster["name"] != envoy.PICKER_CLUSTER:
            continue
        # Picker endpoints are host names here; a STATIC cluster takes only IPs.
        cluster["type"] = "STRICT_DNS"
        cluster["dns_lookup_family"] = "V4_ONLY"
        if tls_dir is not None:
            (host,) = {split_host_port(p)[0] for p in options.pickers}
            cluster["transport_socket"] = _upstream_tls(host, tls_dir)
    return doc


def _upstream_tls(host: str, tls_dir: str) -> dict[str, Any]:
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": _UPSTREAM_TLS,
            "sni": host,
            "common_tls_context": {
                # ext_proc is gRPC: negotiate HTTP/2.
                "alpn_protocols": ["h2"],
                # Sent when the picker asks for one (mTLS: deploy/k8s/components/picker-mtls).
                "tls_certificates": [
                    {
                        "certificate_chain": {"filename": f"{tls_dir}/gateway.crt"},
                        "private_key": {"filename": f"{tls_dir}/gateway.key"},
                    }
                ],
                "validation_context": {
                    "trusted_ca": {"filename": f"{tls_dir}/ca.crt"},
                    "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": host}}],
                },
            },
        },
    }


def compose_config(config_path: str, *, root: Path = Path()) -> str:
    """The checked-in ``deploy/envoy/envoy-compose.yaml``; ``config_path`` is relative to ``root``."""
    options = compose_options(load_config(root / config_path, environ={}))
    return _render(
        compose_bootstrap(options),
        f"--config {config_path} > deploy/envoy/envoy-compose.yaml",
        "docker-compose.yaml mounts it into the envoyproxy/envoy container.",
        config_path,
    )


def compose_tracing_config(config_path: str, *, root: Path = Path()) -> str:
    """The checked-in ``deploy/envoy/envoy-compose-tracing.yaml``: the compose bootstrap with every
    request traced, exported to the ``jaeger`` service."""
    options = compose_options(load_config(root / config_path, environ={}))
    options = dataclasses.replace(options, tracing=envoy.EnvoyTracing(COMPOSE_OTLP_ENDPOINT))
    return _render(
        compose_bootstrap(options),
        f"--variant compose-tracing --config {config_path} > deploy/envoy/envoy-compose-tracing.yaml",
        "deploy/compose/tracing.yaml mounts it into the envoyproxy/envoy container instead.",
        config_path,
    )


def kubernetes_config(config_path: str, *, root: Path = Path()) -> str:
    """The standalone-envoy overlay's bootstrap: the picker Service over TLS."""
    config = load_config(root / config_path, environ={})
    picker = join_host_port(KUBERNETES_PICKER, KUBERNETES_PICKER_PORT)
    options = dataclasses.replace(compose_options(config), pickers=(picker,))
    return _render(
        compose_bootstrap(options, tls_dir=KUBERNETES_TLS_DIR),
        f"--variant kubernetes --config {config_path} > deploy/k8s/overlays/standalone-envoy/envoy.yaml",
        "The standalone-envoy overlay puts it in a ConfigMap.",
        config_path,
    )


def kubernetes_tracing_config(config_path: str, *, root: Path = Path()) -> str:
    """The standalone-envoy-tracing component's bootstrap: the standalone one with the tracer."""
    config = load_config(root / config_path, environ={})
    picker = join_host_port(KUBERNETES_PICKER, KUBERNETES_PICKER_PORT)
    tracing = envoy.EnvoyTracing(KUBERNETES_OTLP_ENDPOINT, sampling_percent=KUBERNETES_SAMPLING_PERCENT)
    options = dataclasses.replace(compose_options(config), pickers=(picker,), tracing=tracing)
    return _render(
        compose_bootstrap(options, tls_dir=KUBERNETES_TLS_DIR),
        f"--variant kubernetes-tracing --config {config_path} "
        "> deploy/k8s/components/standalone-envoy-tracing/envoy-tracing.yaml",
        "The standalone-envoy-tracing component puts it in the standalone Envoy's ConfigMap.",
        config_path,
    )


def _render(doc: dict[str, Any], arguments: str, where: str, config_path: str) -> str:
    header = (
        f"# Generated by pointsman_devstack.deploy from {config_path}; do not edit. Regenerate with:\n"
        f"#   .venv/bin/python -m pointsman_devstack.deploy {arguments}\n"
        f"# {where} Why it looks like this: docs/envoy.md.\n"
    )
    return header + envoy.dump_yaml(doc)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Print an Envoy bootstrap for docker-compose or Kubernetes.")
    parser.add_argument(
        "--variant",
        choices=["compose", "compose-tracing", "kubernetes", "kubernetes-tracing"],
        default="compose",
    )
    parser.add_argument("--config", default=None)
    args = parser.parse_args(argv)
    if args.variant == "compose":
        sys.stdout.write(compose_config(args.config or "deploy/compose/pointsman.yaml"))
    elif args.variant == "compose-tracing":
        sys.stdout.write(compose_tracing_config(args.config or "deploy/compose/pointsman.yaml"))
    elif args.variant == "kubernetes-tracing":
        sys.stdout.write(kubernetes_tracing_config(args.config or "deploy/k8s/base/pointsman.yaml"))
    else:
        sys.stdout.write(kubernetes_config(args.config or "deploy/k8s/base/pointsman.yaml"))


if __name__ == "__main__":
    main()
