"""The one Pointsman config file (``apiVersion: pointsman.dev/v1alpha1``, ``kind: PointsmanConfig``).

Both services read it. Every field has a default; every error names the path of the bad value.
The four scheduling thresholds can be overridden by the environment variables upstream uses,
``redis.url`` by ``REDIS_URL``, and ``tracing`` by the standard ``OTEL_*`` variables.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, ClassVar, Final, Literal
from urllib.parse import unquote

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
)
from pydantic.alias_generators import to_camel

from pointsman_shared.durations import parse_duration
from pointsman_shared.model_server import PRESETS, MetricNames
from pointsman_shared.redis_url import SENTINEL_PORT, RedisTarget, Sentinel, parse_redis_url, redacted

API_VERSION: Final = "pointsman.dev/v1alpha1"
KIND: Final = "PointsmanConfig"

# Upstream's environment variable names for the #423 thresholds, by config key.
THRESHOLD_ENV = {
    "kvCacheThreshold": "KV_CACHE_THRESHOLD",
    "queueThresholdCritical": "QUEUE_THRESHOLD_CRITICAL",
    "queueingThresholdLoRA": "QUEUING_THRESHOLD_LORA",
    "loraAffinityThreshold": "LORA_AFFINITY_THRESHOLD",
}


class ConfigError(ValueError):
    """The config cannot be used; ``problems`` holds ``(path, message)`` pairs."""

    what: ClassVar[str] = "config"  # what the message calls the document (a subclass names its own)

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  {path}: {message}" for path, message in problems)
        super().__init__(f"invalid {self.what} {source}:\n{lines}")


def split_host_port(value: str, default_port: int | None = None) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or (with a default port) a bare host."""
    text = value.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"bad address {value!r}")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    elif ":" not in text:
        host, port_text = text, ""
    else:
        raise ValueError(f"bad address {value!r} (write IPv6 addresses as [addr]:port)")
    if not host:
        raise ValueError(f"address {value!r} has no host")
    if not port_text:
        if default_port is None:
            raise ValueError(f"address {value!r} has no port")
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"address {value!r} has a bad port")
    return host, int(port_text)


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _listen(value: str) -> str:
    return join_host_port(*split_host_port(value))


Seconds = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]
PositiveSeconds = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]
HostPort = Annotated[str, AfterValidator(_listen)]


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        str_strip_whitespace=True,
        allow_inf_nan=False,  # `.inf` (or "1e400") is no rate, weight or threshold
    )


ConfigModel = _Model
"""The base of every section: for a section only one service reads and checks (``picker.http2``)."""


class Criticality(StrEnum):
    CRITICAL = "Critical"
    STANDARD = "Standard"
    SHEDDABLE = "Sheddable"


class FailureMode(StrEnum):
    FAIL_OPEN = "FailOpen"
    FAIL_CLOSE = "FailClose"


# The InferencePool API versions discovery reads: GIE v1.0+ (the default), and the older one GIE v0.x
# served (v1.0-v1.3 still serve it beside v1).
INFERENCE_POOL_V1: Final = "inference.networking.k8s.io/v1"
INFERENCE_POOL_V1ALPHA2: Final = "inference.networking.x-k8s.io/v1alpha2"
InferencePoolApiVersion = Literal["inference.networking.k8s.io/v1", "inference.networking.x-k8s.io/v1alpha2"]


class KubernetesDiscovery(_Model):
    """Pods from an InferencePool and the Ready pods its selector matches (the collector watches both)."""

    # The InferencePool's name; default: pool.name.
    inference_pool: str | None = Field(default=None, min_length=1)
    # Default: the service account's namespace in a cluster, else the kubeconfig context's.
    namespace: str | None = Field(default=None, min_length=1)
    # v1: spec.selector.matchLabels and spec.targetPorts[]; v1alpha2: spec.selector, spec.targetPortNumber.
    api_version: InferencePoolApiVersion = INFERENCE_POOL_V1
    # Unset: the in-cluster service account.
    kubeconfig: str | None = Field(default=None, min_length=1)
    # Write an Accepted condition into the status of the pool's InferenceObjectives and
    # InferenceModelRewrites (when the Role grants it; see docs/collector.md).
    write_status: bool = True


def _host_ports(addresses: tuple[str, ...], default_port: int) -> tuple[str, ...]:
    """``host:port`` each (``default_port`` where none is written), no address twice; errors name the
    item (``[i]: ...``)."""
    normalized: list[str] = []
    for i, raw in enumerate(addresses):
        try:
            address = join_host_port(*split_host_port(raw, default_port))
        except ValueError as exc:
            raise ValueError(f"[{i}]: {exc}") from None
        if address in normalized:
            raise ValueError(f"[{i}]: {address} is listed twice")
        normalized.append(address)
    return tuple(normalized)


class PoolConfig(_Model):
    name: str = Field(default="default-pool", min_length=1)
    target_port: int = Field(default=8000, gt=0, lt=65536)
    endpoints: tuple[str, ...] = ()
    # A file of more endpoints, one per line ('#' comments); the collector re-reads it when it changes.
    endpoints_file: str | None = Field(default=None, min_length=1)
    kubernetes: KubernetesDiscovery | None = None
    failure_mode: FailureMode = FailureMode.FAIL_CLOSE

    @field_validator("endpoints")
    @classmethod
    def _normalize_endpoints(cls, endpoints: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        return _host_ports(endpoints, info.data.get("target_port", 8000))


class TargetModel(_Model):
    name: str = Field(min_length=1)
    weight: int | None = Field(default=None, ge=1, le=1_000_000)


class InferenceModel(_Model):
    """An InferenceModel (inference.networking.x-k8s.io/v1alpha2), as the config file states it; or,
    with ``priority`` instead of ``criticality``, an InferenceObjective (upstream's successor: a
    negative priority is sheddable, zero or more is not)."""

    model_name: str = Field(min_length=1)
    criticality: Criticality | None = None
    priority: int | None = None
    target_models: tuple[TargetModel, ...] = Field(default=(), max_length=10)

    @field_validator("priority")
    @classmethod
    def _criticality_or_priority(cls, priority: int | None, info: ValidationInfo) -> int | None:
        if priority is not None and info.data.get("criticality") is not None:
            raise ValueError("set criticality (InferenceModel) or priority (InferenceObjective), not both")
        return priority

    @property
    def critical(self) -> bool:
        """Never shed: criticality exactly Critical, or a priority of zero or more."""
        if self.priority is not None:
            return self.priority >= 0
        return self.criticality is Criticality.CRITICAL

    @field_validator("target_models")
    @classmethod
    def _weights_all_or_none(cls, targets: tuple[TargetModel, ...]) -> tuple[TargetModel, ...]:
        weighted = sum(t.weight is not None for t in targets)
        if weighted not in (0, len(targets)):
            raise ValueError("set a weight on every target model or on none")
        return targets


class InferenceObjective(_Model):
    """An InferenceObjective (inference.networking.x-k8s.io/v1alpha2) as the config states it. A request
    naming it in the ``picker.objectiveHeader`` header gets its priority: negative is sheddable."""

    name: str = Field(min_length=1)
    priority: int = 0


class SchedulingConfig(_Model):
    kv_cache_threshold: float = Field(default=0.8, ge=0, le=1)
    queue_threshold_critical: int = Field(default=5, ge=0)
    queueing_threshold_lora: int = Field(default=128, ge=0, alias="queueingThresholdLoRA")
    lora_affinity_threshold: float = Field(default=0.999, ge=0, le=1)


class RedisSentinelConfig(_Model):
    """Redis Sentinel spelled out (what a ``redis+sentinel://`` URL says, and the Sentinels' own AUTH)."""

    master_name: str = Field(min_length=1)
    # host:port of each Sentinel (port 26379 when left out); any one that answers will do.
    hosts: tuple[str, ...] = Field(min_length=1)
    db: int = Field(default=0, ge=0)
    # The Redis servers' credentials (the primary's and the replicas').
    username: str | None = Field(default=None, min_length=1)
    password: str | None = Field(default=None, min_length=1, repr=False)
    # The Sentinels' own, when they require AUTH (requirepass in sentinel.conf).
    sentinel_username: str | None = Field(default=None, min_length=1)
    sentinel_password: str | None = Field(default=None, min_length=1, repr=False)
    tls: bool = False

    @field_validator("hosts")
    @classmethod
    def _addresses(cls, hosts: tuple[str, ...]) -> tuple[str, ...]:
        return _host_ports(hosts, SENTINEL_PORT)

    @property
    def target(self) -> Sentinel:
        return Sentinel(
            master_name=self.master_name,
            hosts=tuple(split_host_port(h) for h in self.hosts),
            db=self.db,
            username=self.username,
            password=self.password,
            sentinel_username=self.sentinel_username,
            sentinel_password=self.sentinel_password,
            tls=self.tls,
        )


class RedisConfig(_Model):
    """Where Redis is: ``url`` (any form of ``pointsman_shared.redis_url``), or ``sentinel`` spelled out;
    ``cluster: true`` reads a ``redis://`` URL as a Redis Cluster's start node. :attr:`target` is what
    the clients are built from."""

    # Before url: url's check reads it. A config states url or sentinel, not both.
    sentinel: RedisSentinelConfig | None = None
    url: str = Field(default="redis://127.0.0.1:6379/0", repr=False)  # may hold a password
    cluster: bool = False

    @field_validator("url")
    @classmethod
    def _url(cls, url: str, info: ValidationInfo) -> str:
        if info.data.get("sentinel") is not None:
            raise ValueError("set redis.url (or REDIS_URL) or redis.sentinel, not both")
        parse_redis_url(url)  # RedisUrlError is a ValueError: reported at redis.url
        return url

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, cluster: bool, info: ValidationInfo) -> bool:
        if cluster and info.data.get("sentinel") is not None:
            raise ValueError("redis.sentinel names a Sentinel-managed Redis, not a cluster")
        if cluster and "url" in info.data:
            parse_redis_url(info.data["url"], cluster=True)
        return cluster

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # With sentinel, url is only the unused default: leave it out, so the dump loads again.
        data: dict[str, Any] = handler(self)
        if self.sentinel is not None:
            data.pop("url", None)
        return data

    @property
    def target(self) -> RedisTarget:
        if self.sentinel is not None:
            return self.sentinel.target
        return parse_redis_url(self.url, cluster=self.cluster)

    @property
    def display(self) -> str:
        """Where Redis is, for logs: the URL without its password, or the Sentinels and master name."""
        if self.sentinel is not None:
            return f"Sentinel {','.join(self.sentinel.hosts)} master {self.sentinel.master_name}"
        return redacted(self.url) + (" (cluster)" if self.cluster else "")


class CollectorConfig(_Model):
    interval: PositiveSeconds = 0.05
    timeout: PositiveSeconds = 1.0
    listen: HostPort = "0.0.0.0:9100"
    model_server: Literal["vllm", "sglang"] = "vllm"
    # A pod with no good scrape for this long is published unhealthy.
    staleness: PositiveSeconds = 2.0
    # A pod is published unhealthy after this many failed scrapes in a row.
    max_failures: int = Field(default=3, ge=1)
    # Snapshot keys expire this long after the last publish, so readers can tell a dead collector.
    snapshot_ttl: PositiveSeconds = 10.0
    # Several collector replicas share the pool: each scrapes the pods it owns among the live replicas
    # (leases in Redis, renewed every leaseTtl/3), and the snapshot merges every replica's pods.
    sharing: bool = False
    lease_ttl: PositiveSeconds = 0.15
    # Each pod's prefix-cache hit rate is hits over queries over about this long (from the counters).
    prefix_cache_window: PositiveSeconds = 30.0


class PickerConfig(_Model):
    listen: HostPort = "0.0.0.0:9002"
    health_listen: HostPort = "0.0.0.0:9003"
    metrics_listen: HostPort = "0.0.0.0:9090"
    destination_header: str = Field(default="x-gateway-destination-endpoint", min_length=1)
    metadata_namespace: str = Field(default="envoy.lb", min_length=1)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    # Pods whose data is older than this are used only when no fresh pod exists; a snapshot published
    # longer ago than this counts as none (then pool.failureMode decides).
    max_staleness: Seconds = 2.0
    # Count this picker's assignments not yet seen by a scrape as waiting requests, so a burst between
    # two snapshots spreads instead of landing on the one pod that looked idle.
    count_assignments: bool = True
    # A request carrying this header (any value) gets the scheduling path back in the same response
    # header. Off (null) by default: it tells clients about the pool.
    explain_header: str | None = Field(default=None, min_length=1)
    # The scheduling profile requests go through (see `profiles`).
    profile: str = Field(default="default", min_length=1)
    # The ext_proc server: "native" (Pointsman's own HTTP/2 gRPC server, a fraction of grpcio's CPU per
    # request) or "grpcio" (grpc.aio, the reference implementation). See docs/picker.md, "Speed".
    server: Literal["native", "grpcio"] = "native"
    # How fast a pod computes prompt tokens while it decodes: the picker's estimate of the prompt tokens
    # each pod still has to compute from its recent assignments drains at this rate. Read only by
    # profiles with a least-work-filter.
    prefill_tokens_per_second: float = Field(default=20_000.0, gt=0)
    # The header naming a request's InferenceObjective (upstream's); an objective not in `objectives`,
    # or no header, is the default objective: priority 0, never shed.
    objective_header: str = Field(default="x-gateway-inference-objective", min_length=1)
    # A model no entry of `models` names is served as asked, with the default objective (upstream v1);
    # false answers 404 instead.
    passthrough_unknown_models: bool = True
    # Where InferenceObjectives and model rewrites come from: "config" (`models`, `objectives`), "cluster"
    # (the objects the collector reads from Kubernetes), or "both", the config winning on a clash.
    cluster_objects: Literal["both", "cluster", "config"] = "both"
    # The native server's HTTP/2 limits (picker.server native only; grpcio keeps its own). Only the
    # picker reads them: it checks them itself (pointsman_picker.h2grpc.config), as it checks plugin
    # parameters, and names the bad path the same way.
    http2: dict[str, Any] = Field(default_factory=dict)


class SaturationDetectorConfig(_Model):
    """``flowControl.saturationDetector``: when a pod can take more (upstream's names). A pod is
    saturated when its waiting requests (with this picker's and the peers' assignments a scrape has
    not shown yet) reach ``queueDepthThreshold`` or its KV cache ``kvCacheUtilThreshold``; the pool
    is saturated when every candidate pod is, or when its pods carry ``maxPodRequests`` running and
    waiting requests on average. The first two unset: the scheduling thresholds
    (``queueThresholdCritical``, ``kvCacheThreshold``)."""

    queue_depth_threshold: int | None = Field(default=None, ge=1)
    kv_cache_util_threshold: float | None = Field(default=None, gt=0, le=1)
    # Pointsman's: the pool is saturated, too, when its pods' running plus waiting requests (the
    # unseen assignments counted) reach this on average; the measure of load for a mix where requests
    # wait for a LoRA slot (waiting alone then says little). Null: not used. Measure it for the mix
    # (docs/flow-control.md).
    max_pod_requests: int | None = Field(default=None, ge=1)


class PriorityBand(_Model):
    """``flowControl.priorityBands[]``: one band's bounds and queue time limit (upstream's
    PriorityBandConfig). Requests whose objective has this priority wait in it."""

    priority: int
    # Bounds of the band: past either, a request that would wait is refused at once (429).
    max_requests: int = Field(default=1000, ge=1)
    max_bytes: int = Field(default=256 * 1024 * 1024, ge=1)
    # How long a request may wait in this band; then 429 (sheddable) or 503 (the rest).
    request_ttl: PositiveSeconds | None = Field(default=None, alias="requestTTL")
    # Pointsman's: this band's own thresholds (each one unset: flowControl.saturationDetector's), so
    # that Critical traffic goes on to the pods while Sheddable traffic waits (docs/flow-control.md).
    saturation_detector: SaturationDetectorConfig | None = None


class DispatchDeadlineConfig(_Model):
    """``flowControl.dispatchDeadline`` (Pointsman's): a held request is dispatched only when the pod it
    would go to is expected to start answering within what its band's time limit has left; otherwise
    it is answered at the gateway as if it had expired (429 sheddable, 503 the rest), not sent to be
    late. The expected wait is measured per pod: the time from dispatch to the response headers of the
    requests the pod was sent (docs/flow-control.md)."""

    enabled: bool = True
    # A pod's expected wait before any of the pool's responses has been seen.
    default_wait: Seconds = 0.5


class FlowControlConfig(_Model):
    """``flowControl``: hold requests in the picker while the pool is saturated, by band (priority,
    highest first), then by flow in turn (``x-gateway-inference-fairness-id``), then first come first
    served. Off by default."""

    enabled: bool = False
    # Bounds of all bands together.
    max_requests: int = Field(default=10_000, ge=1)
    max_bytes: int = Field(default=1024 * 1024 * 1024, ge=1)
    # The queue time limit of a band that sets none.
    default_request_ttl: PositiveSeconds = Field(default=30.0, alias="defaultRequestTTL")
    # Bands by priority; a priority no band names gets a band with the defaults.
    priority_bands: tuple[PriorityBand, ...] = ()
    saturation_detector: SaturationDetectorConfig = SaturationDetectorConfig()
    # The header naming a request's flow (upstream's); no header: ``default-flow``.
    fairness_header: str = Field(default="x-gateway-inference-fairness-id", min_length=1)
    # The longest ext_proc message timeout the picker asks Envoy for (override_message_timeout) while
    # a request waits: Envoy's filter must set max_message_timeout at least this high (every Envoy
    # config in deploy/ does: 60s).
    max_message_timeout: PositiveSeconds = 60.0
    dispatch_deadline: DispatchDeadlineConfig = DispatchDeadlineConfig()

    @field_validator("priority_bands")
    @classmethod
    def _unique_priorities(cls, bands: tuple[PriorityBand, ...]) -> tuple[PriorityBand, ...]:
        seen: set[int] = set()
        for i, band in enumerate(bands):
            if band.priority in seen:
                raise ValueError(f"[{i}].priority {band.priority} is listed twice")
            seen.add(band.priority)
        return bands

    def band(self, priority: int) -> PriorityBand:
        """The band of ``priority`` (one with the defaults when none is configured)."""
        for band in self.priority_bands:
            if band.priority == priority:
                return band
        return PriorityBand(priority=priority)

    def ttl(self, priority: int) -> float:
        band = self.band(priority)
        return band.request_ttl if band.request_ttl is not None else self.default_request_ttl


# The samplers of OTEL_TRACES_SAMPLER (the OpenTelemetry SDK's names).
Sampler = Literal[
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
]


class TracingConfig(_Model):
    """``tracing``: OpenTelemetry spans exported over OTLP, by every service (pointsman_shared.tracing).
    Off by default; the standard ``OTEL_*`` environment variables override these fields."""

    enabled: bool = False
    # The OTLP receiver. grpc: host:port or http(s)://host:port; http/protobuf: the URL spans are POSTed
    # to (/v1/traces is added to a URL without a path).
    endpoint: str = Field(default="http://localhost:4317", min_length=1)
    protocol: Literal["grpc", "http/protobuf"] = "grpc"
    # parentbased_*: a request that arrives with a trace context follows its sampled flag; one without
    # is sampled by the rest of the name (traceidratio: `ratio` of them).
    sampler: Sampler = "parentbased_traceidratio"
    ratio: float = Field(default=0.1, ge=0, le=1)
    # Default: each service's own (pointsman-picker, pointsman-collector, pointsman-sim).
    service_name: str | None = Field(default=None, min_length=1)
    resource_attributes: dict[str, str] = Field(default_factory=dict)
    # Ended spans wait here for the exporter; a span that finds it full is dropped (and counted).
    max_queue_size: int = Field(default=2048, ge=1)
    max_export_batch_size: int = Field(default=512, ge=1)
    schedule_delay: PositiveSeconds = 1.0
    export_timeout: PositiveSeconds = 5.0


class PluginSpec(_Model):
    """One scheduling plugin (a filter, a scorer or a picker); the picker knows the types and checks
    ``parameters``. ``name`` defaults to ``type``: profiles refer to plugins by name."""

    type: str = Field(min_length=1)
    name: str | None = Field(default=None, min_length=1)
    parameters: dict[str, Any] = Field(default_factory=dict)

    @property
    def ref(self) -> str:
        return self.name or self.type


class ProfilePlugin(_Model):
    plugin_ref: str = Field(min_length=1)
    weight: float = Field(default=1.0, ge=0)  # scorers only


class ProfileSpec(_Model):
    """Filters in order, then the weighted scorers, then one picker."""

    name: str = Field(min_length=1)
    plugins: tuple[ProfilePlugin, ...] = Field(min_length=1)


class PointsmanConfig(_Model):
    api_version: Literal["pointsman.dev/v1alpha1"] = API_VERSION
    kind: Literal["PointsmanConfig"] = KIND
    pool: PoolConfig = PoolConfig()
    models: tuple[InferenceModel, ...] = ()
    objectives: tuple[InferenceObjective, ...] = ()
    scheduling: SchedulingConfig = SchedulingConfig()
    redis: RedisConfig = RedisConfig()
    collector: CollectorConfig = CollectorConfig()
    picker: PickerConfig = PickerConfig()
    flow_control: FlowControlConfig = FlowControlConfig()
    tracing: TracingConfig = TracingConfig()
    # Scheduling plugins and profiles; picker.profile names the one in use ("default", the #423 tree,
    # and "scorer" are built in).
    plugins: tuple[PluginSpec, ...] = ()
    profiles: tuple[ProfileSpec, ...] = ()

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: tuple[InferenceModel, ...]) -> tuple[InferenceModel, ...]:
        seen: set[str] = set()
        for i, model in enumerate(models):
            if model.model_name in seen:
                raise ValueError(f"[{i}].modelName {model.model_name!r} is declared twice")
            seen.add(model.model_name)
        return models

    @field_validator("objectives")
    @classmethod
    def _unique_objectives(cls, objectives: tuple[InferenceObjective, ...]) -> tuple[InferenceObjective, ...]:
        seen: set[str] = set()
        for i, objective in enumerate(objectives):
            if objective.name in seen:
                raise ValueError(f"[{i}].name {objective.name!r} is declared twice")
            seen.add(objective.name)
        return objectives

    @property
    def metric_names(self) -> MetricNames:
        return PRESETS[self.collector.model_server]


def parse_config(
    doc: Mapping[str, Any] | None, *, source: str = "<config>", environ: Mapping[str, str] | None = None
) -> PointsmanConfig:
    """Validate a config document, then apply environment overrides."""
    data: dict[str, Any] = dict(doc or {})
    if environ:
        data = _with_env_overrides(data, environ)
    try:
        return PointsmanConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, validation_problems(exc)) from None


def load_config(path: str | Path, *, environ: Mapping[str, str] | None = None) -> PointsmanConfig:
    return parse_config(load_document(path), source=str(path), environ=environ)


def load_document(path: str | Path) -> dict[str, Any]:
    """The YAML mapping in ``path``, or :class:`ConfigError`: unreadable, not UTF-8, not YAML, not a
    mapping, or empty (a truncating editor or ``> file`` leaves nothing: that is not "every default")."""
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(source, [("", f"cannot read: {exc.strerror or exc}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(source, [("", f"not UTF-8: byte {exc.start} is {raw[exc.start]:#04x}")]) from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [("", f"not valid YAML: {exc}")]) from None
    # PyYAML's constructors raise these for values it scanned but cannot build (a 2001-02-30 timestamp,
    # "!!int 0b"), and the composer recurses once per level of nesting.
    except (ValueError, TypeError, AttributeError, RecursionError) as exc:
        raise ConfigError(source, [("", f"not valid YAML: {type(exc).__name__}: {exc}")]) from None
    if doc is None:
        raise ConfigError(source, [("", "the file is empty (at least `kind: PointsmanConfig`)")])
    if not isinstance(doc, dict):
        raise ConfigError(source, [("", "the document must be a mapping")])
    return doc


def _with_env_overrides(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    overrides = {key: environ[var] for key, var in THRESHOLD_ENV.items() if var in environ}
    scheduling = data.get("scheduling")
    if overrides and (scheduling is None or isinstance(scheduling, dict)):
        data["scheduling"] = {**(scheduling or {}), **overrides}
    redis = data.get("redis")
    if "REDIS_URL" in environ and (redis is None or isinstance(redis, dict)):
        data["redis"] = {**(redis or {}), "url": environ["REDIS_URL"]}
    tracing = data.get("tracing")
    found = tracing_env(
        environ, (tracing or {}).get("protocol", "grpc") if isinstance(tracing, dict) else "grpc"
    )
    if found and (tracing is None or isinstance(tracing, dict)):
        data["tracing"] = {**(tracing or {}), **found}
    return data


def tracing_env(environ: Mapping[str, str], protocol: str) -> dict[str, Any]:
    """The ``tracing`` fields the standard OpenTelemetry variables set (OTEL_SDK_DISABLED=true turns
    tracing off; OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is used as it is, OTEL_EXPORTER_OTLP_ENDPOINT is a
    base URL that gets /v1/traces over http/protobuf, as the specification says)."""
    found: dict[str, Any] = {}
    if env_protocol := environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL"
    ):
        found["protocol"] = protocol = env_protocol
    if endpoint := environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        found["endpoint"] = endpoint
    elif endpoint := environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        found["endpoint"] = endpoint.rstrip("/") + "/v1/traces" if protocol == "http/protobuf" else endpoint
    if sampler := environ.get("OTEL_TRACES_SAMPLER"):
        found["sampler"] = sampler
    if ratio := environ.get("OTEL_TRACES_SAMPLER_ARG"):
        found["ratio"] = ratio
    if name := environ.get("OTEL_SERVICE_NAME"):
        found["serviceName"] = name
    if attributes := environ.get("OTEL_RESOURCE_ATTRIBUTES"):
        found["resourceAttributes"] = dict(_key_values(attributes))
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        found["enabled"] = False
    return found


def _key_values(text: str) -> list[tuple[str, str]]:
    """``k=v,k2=v2`` (values percent-decoded), as OTEL_RESOURCE_ATTRIBUTES writes them."""
    pairs = []
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            pairs.append((key.strip(), unquote(value.strip())))
    return pairs


# A validator that checks list items reports "[i]: message" or "[i].key ...": fold that into the path.
_ITEM_PREFIX = re.compile(r"^(\[\d+\](?:\.\w+)*):?\s*")
_PLAIN_KEY = re.compile(r"[^\s.\[\]\"']+")


def validation_problems(exc: ValidationError) -> list[tuple[str, str]]:
    """pydantic's errors as ``(path, message)`` pairs, the path written as in the document
    (``pool.endpoints[2]``); for every file validated this way."""
    return [_problem(err["loc"], err["msg"]) for err in exc.errors()]


def _problem(loc: tuple[int | str, ...], msg: str) -> tuple[str, str]:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not part.startswith(("function-", "tagged-union")):  # pydantic's names, not the document's
            # A key that would read as no path or as another path ("", "pool.name") is quoted.
            key = part if _PLAIN_KEY.fullmatch(part) else repr(part)
            path += f".{key}" if path else key
    message = msg.removeprefix("Value error, ")
    if match := _ITEM_PREFIX.match(message):
        path += match.group(1)
        message = message[match.end() :]
    return path, message
