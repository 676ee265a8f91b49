"""The upstream endpoint picker's command line and its EndpointPickerConfig file, as Pointsman config.

An upstream Deployment runs the picker with ``--pool-name``, ``--pool-namespace``, ``--pool-group``,
``--config-file`` and more; with these aliases its spec needs only the image swapped and a Redis URL
added. A flag that names a config field becomes an override of that field; a flag whose job Pointsman
does elsewhere or not at all is accepted and named in a warning. ``--config-file`` may name a Pointsman
config or an upstream ``EndpointPickerConfig`` (plugins and scheduling profiles), translated here.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pointsman_shared.config import ConfigError, PointsmanConfig, load_document, parse_config

GROUP_VERSIONS = {
    "inference.networking.k8s.io": "inference.networking.k8s.io/v1",
    "inference.networking.x-k8s.io": "inference.networking.x-k8s.io/v1alpha2",
}
# Upstream flags taken and not used, with why: an upstream Deployment's args must not stop the picker.
IGNORED_FLAGS = {
    "zap-encoder": "logs are text lines",
    "metrics-endpoint-auth": "the metrics port needs no token",
    "ha-enable-leader-election": "pickers are active-active, sharing Redis",
    "secure-serving": "TLS is a sidecar's (docs/deploy.md)",
    "cert-path": "TLS is a sidecar's (docs/deploy.md)",
    "enable-cert-reload": "TLS is a sidecar's (docs/deploy.md)",
    "enable-pprof": "no profiler endpoint",
    "health-checking": "gRPC health is always served",
    "refresh-metrics-interval": "the collector scrapes (collector.interval)",
    "refresh-prometheus-metrics-interval": "pool gauges are computed at scrape time",
    "model-server-metrics-scheme": "the collector scrapes",
    "model-server-metrics-path": "the collector scrapes",
    "model-server-metrics-port": "the collector scrapes",
    "model-server-metrics-https-insecure-skip-verify": "the collector scrapes",
    "total-queued-requests-metric": "the collector reads metric names (collector.modelServer)",
    "total-running-requests-metric": "the collector reads metric names (collector.modelServer)",
    "kv-cache-usage-percentage-metric": "the collector reads metric names (collector.modelServer)",
    "lora-info-metric": "the collector reads metric names (collector.modelServer)",
    "cache-info-metric": "the collector reads metric names (collector.modelServer)",
    "endpoint-selector": "pods come from the InferencePool or pool.endpoints",
    "endpoint-target-ports": "pods come from the InferencePool or pool.endpoints",
    "disable-endpoint-subset-filter": "no subset filter",
}
# EndpointPickerConfig plugin types: Pointsman's type of the same behaviour, or why there is none.
PLUGIN_TYPES = {
    "queue-scorer": "queue-scorer",
    "kv-cache-utilization-scorer": "kv-cache-scorer",
    "lora-affinity-scorer": "lora-affinity-scorer",
    "max-score-picker": "max-score-picker",
    "random-picker": "random-picker",
    # the prefix index's parameters are read from either (upstream's names of every release)
    "prefix-cache-scorer": "prefix-cache-scorer",
    "approx-prefix-cache-producer": "approx-prefix-cache-producer",
    "prefix-cache-affinity-filter": "prefix-cache-affinity-filter",
}
IGNORED_PLUGINS = {
    "metrics-data-source": "the collector scrapes the pods",
    "core-metrics-extractor": "the collector parses the pages",
    "single-profile-handler": "a picker runs one profile",
}
ENDPOINT_PICKER_KIND = "EndpointPickerConfig"
# An EndpointPickerConfig's flow-control keys, and the fields kept under their upstream names.
FLOW_CONTROL_KEYS = ("featureGates", "flowControl", "saturationDetector")
FLOW_CONTROL_FIELDS = ("maxBytes", "maxRequests", "defaultRequestTTL")
BAND_FIELDS = ("priority", "maxBytes", "maxRequests", "requestTTL")
DETECTOR_FIELDS = ("queueDepthThreshold", "kvCacheUtilThreshold")


def add_flags(parser: argparse.ArgumentParser, *, metrics_field: str, grpc: bool) -> None:
    """Add the upstream aliases to ``parser``; ``metrics_field`` is the listen address ``--metrics-port``
    sets (``picker.metricsListen`` or ``collector.listen``); ``grpc``: the gRPC port flags too (the
    picker's; a collector serves no gRPC)."""
    group = parser.add_argument_group("upstream endpoint-picker flags (aliases of config fields)")
    group.add_argument("--config-file", dest="config", help="the same as --config")
    group.add_argument("--pool-name", help="pool.name")
    group.add_argument("--pool-namespace", help="pool.kubernetes.namespace")
    group.add_argument(
        "--pool-group", choices=sorted(GROUP_VERSIONS), help="pool.kubernetes.apiVersion, by API group"
    )
    if grpc:
        group.add_argument("--grpc-port", type=_port, help="the port of picker.listen")
        group.add_argument("--grpc-health-port", type=_port, help="the port of picker.healthListen")
    group.add_argument("--metrics-port", type=_port, help=f"the port of {metrics_field}")
    group.add_argument("-v", dest="verbosity", type=int, help="4 or more: DEBUG logging")
    group.add_argument(
        "--tracing", nargs="?", const=True, type=_boolean, help="tracing.enabled (a bare --tracing: true)"
    )
    for name in IGNORED_FLAGS:
        # Go flags take `--flag value`, `--flag=value` or, for booleans, a bare `--flag`.
        group.add_argument(f"--{name}", nargs="?", const="true", help=argparse.SUPPRESS)
    parser.set_defaults(_metrics_field=metrics_field)


def _boolean(text: str) -> bool:
    """A Go flag's boolean."""
    value = text.strip().lower()
    if value in ("1", "t", "true"):
        return True
    if value in ("0", "f", "false"):
        return False
    raise argparse.ArgumentTypeError(f"{text} is not a boolean")


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{text} is not a port")
    return port


def ignored(args: argparse.Namespace) -> list[str]:
    """A warning per ignored upstream flag that was given."""
    return [
        f"--{name} is accepted and not used: {why}"
        for name, why in IGNORED_FLAGS.items()
        if getattr(args, name.replace("-", "_"), None) is not None
    ]


def log_level(args: argparse.Namespace, default: str) -> str:
    verbosity = getattr(args, "verbosity", None)
    if verbosity is None:
        return default.upper()
    return "DEBUG" if verbosity >= 4 else "INFO"


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields the given aliases set, as a partial document."""
    doc: dict[str, Any] = {}
    if args.pool_name:
        doc.setdefault("pool", {})["name"] = args.pool_name
    kubernetes: dict[str, Any] = {}
    if args.pool_namespace:
        kubernetes["namespace"] = args.pool_namespace
    if args.pool_group:
        kubernetes["apiVersion"] = GROUP_VERSIONS[args.pool_group]
    if kubernetes:
        doc.setdefault("pool", {})["kubernetes"] = kubernetes
    if getattr(args, "tracing", None) is not None:
        doc["tracing"] = {"enabled": args.tracing}
    ports = {
        "picker.listen": getattr(args, "grpc_port", None),
        "picker.healthListen": getattr(args, "grpc_health_port", None),
    }
    ports[args._metrics_field] = args.metrics_port
    for field, port in ports.items():
        if port is not None:
            section, key = field.split(".")
            doc.setdefault(section, {})[key] = port  # a bare port: merged with the host in with_ports
    return doc


def with_overrides(doc: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` with ``extra`` merged in, section by section; a bare port replaces only the port of a
    ``host:port`` listen address."""
    merged: dict[str, Any] = dict(doc)
    for section, fields in extra.items():
        current = merged.get(section)
        base: dict[str, Any] = dict(current) if isinstance(current, Mapping) else {}
        for key, value in fields.items():
            if isinstance(value, int) and not isinstance(value, bool):
                host = str(base.get(key, "0.0.0.0:0")).rpartition(":")[0] or "0.0.0.0"
                base[key] = f"{host}:{value}"
            elif isinstance(value, Mapping) and isinstance(base.get(key), Mapping):
                base[key] = {**base[key], **value}
            else:
                base[key] = value
        merged[section] = base
    return merged


def from_endpoint_picker_config(doc: Mapping[str, Any], source: str) -> tuple[dict[str, Any], list[str]]:
    """An upstream EndpointPickerConfig as a Pointsman config document (its plugins and scheduling
    profiles; the first profile is the one in use), and a warning per plugin left out."""
    problems: list[tuple[str, str]] = []
    warnings: list[str] = []
    known_keys = {"apiVersion", "kind", "plugins", "schedulingProfiles", "parser", *FLOW_CONTROL_KEYS}
    unknown = sorted(map(str, set(doc) - known_keys))
    problems += [(key, "not an EndpointPickerConfig field") for key in unknown]
    plugins: list[dict[str, Any]] = []
    dropped: set[str] = set()
    for i, spec in enumerate(_items(doc.get("plugins"), "plugins", problems)):
        kind, name = spec.get("type"), spec.get("name") or spec.get("type")
        if not isinstance(kind, str):  # a list or a mapping cannot even be looked up
            problems.append((f"plugins[{i}].type", f"must be a string, not {type(kind).__name__}"))
        elif kind in PLUGIN_TYPES:
            parameters = spec.get("parameters") or {}
            if isinstance(parameters, Mapping) and "hashBlockSize" in parameters:
                parameters = dict(parameters)  # not the caller's document
                # v1.0's block in characters, from before autoTune (v1.2) could replace it
                parameters.setdefault("autoTune", False)
            plugins.append({"type": PLUGIN_TYPES[kind], "name": name, "parameters": parameters})
        elif kind in IGNORED_PLUGINS:
            dropped.add(str(name))
            warnings.append(f"{source}: plugins[{i}] {kind} is left out: {IGNORED_PLUGINS[kind]}")
        else:
            known = ", ".join([*PLUGIN_TYPES, *IGNORED_PLUGINS])
            problems.append((f"plugins[{i}].type", f"{kind!r} is not a type Pointsman runs (known: {known})"))
    profiles: list[dict[str, Any]] = []
    for i, spec in enumerate(_items(doc.get("schedulingProfiles"), "schedulingProfiles", problems)):
        refs = [
            {"pluginRef": entry.get("pluginRef"), "weight": entry.get("weight", 1)}
            for entry in _items(spec.get("plugins"), f"schedulingProfiles[{i}].plugins", problems)
            if not isinstance(entry.get("pluginRef"), str) or entry["pluginRef"] not in dropped
        ]
        profiles.append({"name": spec.get("name"), "plugins": refs})
    if problems:
        raise ConfigError(source, problems)
    translated: dict[str, Any] = {"plugins": plugins, "profiles": profiles}
    if profiles:
        translated["picker"] = {"profile": profiles[0]["name"]}
    flow = flow_control(doc, source, warnings, problems)
    if problems:
        raise ConfigError(source, problems)
    if flow is not None:
        translated["flowControl"] = flow
    return translated, warnings


def flow_control(
    doc: Mapping[str, Any], source: str, warnings: list[str], problems: list[tuple[str, str]]
) -> dict[str, Any] | None:
    """The EndpointPickerConfig's ``flowControl`` and ``saturationDetector`` sections (on with the
    ``flowControl`` feature gate or a ``flowControl`` section), as ``flowControl``; the fields of the
    same name are kept, the others named in a warning."""
    gates = doc.get("featureGates") or []
    section = doc.get("flowControl")
    detector = doc.get("saturationDetector")
    for key, value, kind in (
        ("featureGates", gates, list),
        ("flowControl", section, Mapping),
        ("saturationDetector", detector, Mapping),
    ):
        if value is not None and not isinstance(value, kind):
            problems.append((key, f"must be a {'list' if kind is list else 'mapping'}"))
            return None
    if not all(isinstance(gate, str) for gate in gates):
        problems.append(("featureGates", "must be a list of strings"))
        return None
    if section is None and "flowControl" not in gates:
        if detector is not None:
            warnings.append(f"{source}: saturationDetector is left out: flow control is off")
        return None
    flow: dict[str, Any] = {"enabled": True}
    for key, value in (section or {}).items():
        key = str(key)
        if key in FLOW_CONTROL_FIELDS:
            flow[key] = value
        elif key == "priorityBands":
            bands = _items(value, "flowControl.priorityBands", problems)
            flow[key] = [{k: v for k, v in band.items() if k in BAND_FIELDS} for band in bands]
        else:
            warnings.append(f"{source}: flowControl.{key} is left out: Pointsman has no such setting")
    if isinstance(detector, Mapping):
        kept = {k: v for k, v in detector.items() if k in DETECTOR_FIELDS}
        for key in sorted(set(detector) - set(kept)):
            warnings.append(f"{source}: saturationDetector.{key} is left out (picker.maxStaleness rules)")
        flow["saturationDetector"] = kept
    return flow


def _items(value: Any, path: str, problems: list[tuple[str, str]]) -> Sequence[Mapping[str, Any]]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
        problems.append((path, "must be a list of mappings"))
        return ()
    return value


def load(
    path: str | Path, *, extra: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> tuple[PointsmanConfig, list[str]]:
    """The config in ``path`` (Pointsman's, or an upstream EndpointPickerConfig) with the flags'
    ``extra`` fields and the environment's overrides; and the warnings of its translation."""
    doc = load_document(path)
    warnings: list[str] = []
    if doc.get("kind") == ENDPOINT_PICKER_KIND:
        doc, warnings = from_endpoint_picker_config(doc, str(path))
    return parse_config(with_overrides(doc, extra), source=str(path), environ=environ), warnings
