"""deploy/helm/pointsman through Helm's own Go library (helm-python-sdk: no helm binary, nothing downloaded):
`helm lint` and `helm template` of every values file in the chart's ci/ and of the default one with every
provider; every rendered object valid against the Kubernetes schemas (kubernetes-validate, offline), the
GIE CRDs of each release it is meant for (tests/deploy/data/gie-crds) or Envoy Gateway's pinned release's
(tests/deploy/data/eg-crds); and the pieces agree: the rendered
Pointsman config loads with the services' own loader and names the pool, the probes and Services hit the
ports it listens on, the collector's Role allows every call its discovery makes, the NetworkPolicies let
the collectors reach the API, the pods and Redis and only collectors and pickers reach Redis, every pod
meets the restricted Pod Security Standard, and each provider's objects point at the pool and the picker."""

from __future__ import annotations

import base64
import copy
import functools
import json
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from deploy_kit import (
    DASHBOARDS,
    GIE_RELEASES,
    REPO,
    eg_problems,
    file_tree,
    is_eg_kind,
    is_gie_kind,
    load_yaml,
    makefile_copies,
    restricted_pod_problems,
)
from test_deploy_k8s import (
    CLUSTER_RESOURCES,
    KUBERNETES_VERSION,
    THIRD_PARTY,
    V1_RELEASES,
    _find,
    _gie_problems,
    _one,
    _picker_ref,
    _policies_allow,
    _pool_ports,
    _pool_selector,
    _role_permissions,
    cluster_permissions,
    discover_pool,
    envoy_gateway_usage_path,
    watch_cluster_objects,
)

from pointsman_picker.health import LIVENESS, READINESS_SERVICES
from pointsman_picker.server import checked
from pointsman_shared.config import PointsmanConfig, load_config, split_host_port
from pointsman_shared.redis_url import Cluster, Sentinel

CHART = REPO / "deploy/helm/pointsman"
CI = CHART / "ci"
# Not "pointsman": a name the chart hard-coded instead of deriving from the release would show.
RELEASE = "llama"
NAMESPACE = "inference"
PICKER, COLLECTOR, REDIS = f"{RELEASE}-epp", f"{RELEASE}-collector", f"{RELEASE}-redis"
PROVIDERS = ("none", "gke", "istio", "envoy-gateway")
HELM_KUBE_VERSION = f"v{KUBERNETES_VERSION}.0"
# Kinds from other projects' CRDs, checked by what refers to what (THIRD_PARTY: the kustomize tests').
UNCHECKED = {
    **THIRD_PARTY,
    "networking.istio.io/v1": {"DestinationRule"},
    "networking.gke.io/v1": {"HealthCheckPolicy", "GCPBackendPolicy"},
    "monitoring.googleapis.com/v1": {"PodMonitoring"},
}
# The GIE releases whose CRDs accept each case's GIE objects; every other release must refuse one
# (test_the_gie_release_matrix). Cases not listed: every release with the v1 pool.
SUPPORTED_RELEASES = {
    # InferenceObjective: v1.0-v1.5.
    "models-and-objectives": ("v1.0.2", "v1.3.1", "v1.5.0"),
    # InferenceModelRewrite: v1.3-v1.5 (none in v1.0; v1.6 moved it out).
    "model-rewrites": ("v1.3.1", "v1.5.0"),
    # v1.0's InferencePool takes one target port.
    "data-parallel": ("v1.3.1", "v1.5.0", "v1.6.0"),
    # InferenceModel: v0.x only.
    "v1alpha2": ("v0.5.1",),
}
# The labels and namespace of a gateway's pods that each provider's picker NetworkPolicy lets in (None:
# anyone, GKE's proxies are not pods of the cluster).
GATEWAY_PODS: dict[str, tuple[dict[str, str], str] | None] = {
    "none": ({"pointsman.dev/gateway": "true"}, "gateways"),
    "envoy-gateway": (
        {"app.kubernetes.io/managed-by": "envoy-gateway", "app.kubernetes.io/component": "proxy"},
        "envoy-gateway-system",
    ),
    "istio": ({"gateway.networking.k8s.io/gateway-name": "inference-gateway"}, "istio-ingress"),
    "gke": None,
}
# The labels and namespace of the scrapers each provider's NetworkPolicies let read the metrics and
# /v1/pool (GKE: Managed Prometheus's collectors, any pod of the gmp-system namespace).
_PROMETHEUS = ({"app.kubernetes.io/name": "prometheus", "prometheus": "k8s"}, "monitoring")
SCRAPER_PODS: dict[str, tuple[dict[str, str], str]] = {
    "none": _PROMETHEUS,
    "envoy-gateway": _PROMETHEUS,
    "istio": _PROMETHEUS,
    "gke": ({"app.kubernetes.io/name": "collector"}, "gmp-system"),
}
Objects = list[dict[str, Any]]
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _cases() -> dict[str, dict[str, Any]]:
    """The values of each file in ci/ by its name, and of the default one with each other provider."""
    cases = {path.stem: load_yaml(path) for path in sorted(CI.glob("*.yaml"))}
    for provider in PROVIDERS[1:]:
        cases[f"default+{provider}"] = {**cases["default"], "provider": {"name": provider}}
    return cases


CASES = _cases()


@functools.cache
def _render(case: str) -> tuple[dict[str, Any], ...]:
    return tuple(_render_values(CASES[case]))


def _render_values(values: dict[str, Any]) -> Objects:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    return [
        doc
        for path, text in sorted(manifests.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.load_all(text, Loader=_LOADER)
        if doc
    ]


def _objects(case: str) -> Objects:
    return copy.deepcopy(list(_render(case)))


def _values(case: str) -> dict[str, Any]:
    """The values the case renders with: the chart's defaults under the case's."""
    with helm.Chart.load(CHART) as chart:
        return chart.merge_values(CASES[case])


def _provider(case: str) -> str:
    return str(_values(case)["provider"]["name"])


def _pod(objects: Objects, kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = _one(objects, kind, name)["spec"]["template"]["spec"]
    return spec


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    (container,) = [c for c in pod["containers"] if c["name"] == name]
    return container


def _pod_labels(objects: Objects, kind: str, name: str) -> dict[str, str]:
    labels: dict[str, str] = _one(objects, kind, name)["spec"]["template"]["metadata"]["labels"]
    return labels


def _redis_url(objects: Objects) -> str | None:
    """REDIS_URL as the picker gets it, from the Secret the chart renders (None: a Secret of the user's)."""
    (env,) = [
        e
        for e in _container(_pod(objects, "Deployment", PICKER), "picker")["env"]
        if e["name"] == "REDIS_URL"
    ]
    ref = env["valueFrom"]["secretKeyRef"]
    secrets = _find(objects, "Secret", ref["name"])
    if not secrets:
        return None
    return base64.b64decode(secrets[0]["data"][ref["key"]]).decode()


def _load_config(objects: Objects, directory: Path, redis_url: str | None = None) -> PointsmanConfig:
    """The ConfigMap's pointsman.yaml, loaded as the services load it: from the mounted file, with the
    REDIS_URL the pods get (``redis_url`` instead, if given); then the picker's own check of its plugins
    and profiles."""
    config_map = _one(objects, "ConfigMap", f"{RELEASE}-config")
    path = directory / "pointsman.yaml"
    path.write_text(config_map["data"]["pointsman.yaml"], encoding="utf-8")
    url = redis_url or _redis_url(objects) or "rediss://user:password@redis.example:6380/0"
    return checked(load_config(path, environ={"REDIS_URL": url}), str(path))


def _port(listen: str) -> int:
    return split_host_port(listen)[1]


# --- Helm itself ---------------------------------------------------------------------------------------


def test_helm_comes_from_the_pinned_package() -> None:
    pinned = [line for line in (REPO / "requirements/dev.txt").read_text().splitlines() if "helm" in line]
    assert f"helm-python-sdk=={helm.__version__}" in pinned
    assert helm.helm_sdk_version().startswith("v4.")


@pytest.mark.parametrize("case", CASES)
def test_helm_lint(case: str) -> None:
    report = helm.lint(CHART, CASES[case], strict=True, kube_version=HELM_KUBE_VERSION)
    assert report["errors"] == []
    # Severity 1 is information (Chart.yaml has no icon); 2 and above are warnings and errors.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        ("inferencePool.modelServers=null", "inferencePool.modelServers.matchLabels is required"),
        # values.schema.json: the words a value may be, and no key the chart does not know.
        ("provider.name=kgateway", "/provider/name': value must be one of 'none', 'gke'"),
        ("inferencePool.modelServerType=triton-tensorrt-llm", "/inferencePool/modelServerType'"),
        ("inferenceExtension.replica=3", "additional properties 'replica' not allowed"),
        ("inferenceExtension.pluginsConfigFile=default-plugins.yaml", "'pluginsConfigFile' not allowed"),
        ("redis.sentinel.hosts[0]=sentinel", "/redis/sentinel/hosts/0'"),
        # templates/_validations.tpl: what depends on several values.
        ("redis.mode=sentinel", "redis.mode sentinel needs redis.sentinel.hosts"),
        ("redis.mode=external", "redis.mode external needs"),
        ("redis.mode=external,redis.external.url=redis+sentinel://s:26379/m", "must start with"),
        (
            "inferencePool.apiVersion=inference.networking.x-k8s.io/v1alpha2,"
            "inferencePool.targetPorts[0].number=8000,inferencePool.targetPorts[1].number=8001",
            "one target port",
        ),
        ("inferenceModelRewrites.enable=true", "additional properties 'enable' not allowed"),
        (
            "inferencePool.apiVersion=inference.networking.x-k8s.io/v1alpha2,inferenceModelRewrites.enabled=true",
            "inferenceModelRewrites need the v1 InferencePool",
        ),
        ("config.pool.name=other", "config.pool is the chart's to write"),
        ("inferenceExtension.tracing.sampling.samplerArg=2", "samplerArg"),
        ("inferenceExtension.tracing.sampling.sampler=sometimes", "sampler"),
        ("config.models[0].modelName=m", "config.models is the chart's to write"),
        (
            "provider.name=envoy-gateway,provider.envoyGateway.patchPolicy.enabled=true",
            "attaches to an HTTPRoute",
        ),
    ],
)
def test_the_chart_refuses_values_it_cannot_serve(sets: str, message: str) -> None:
    # As `helm template -f ci/default.yaml --set SETS` would.
    values = helm.parse_set_string(f"inferencePool.modelServers.matchLabels.app=vllm,{sets}")
    refused = (helm.HelmValuesError, helm.HelmRenderError)
    with helm.Chart.load(CHART) as chart, pytest.raises(refused, match=message):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_the_values_keep_upstream_s_names() -> None:
    # The upstream inferencepool chart's values where the concept is the same (its values.yaml, v1.5.0).
    values = load_yaml(CHART / "values.yaml")
    for path in (
        "inferencePool.targetPorts",
        "inferencePool.modelServers",
        "inferencePool.modelServerType",
        "inferenceExtension.replicas",
        "inferenceExtension.image.repository",
        "inferenceExtension.extProcPort",
        "inferenceExtension.failureMode",
        "inferenceExtension.flags",
        "inferenceExtension.env",
        "inferenceExtension.monitoring.prometheus.enabled",
        "inferenceExtension.tracing.enabled",
        "inferenceExtension.tracing.otelExporterEndpoint",
        "inferenceExtension.tracing.sampling.sampler",
        "inferenceExtension.tracing.sampling.samplerArg",
        "provider.name",
        "provider.gke.autopilot",
        "provider.istio.destinationRule.host",
        "experimentalHttpRoute.enabled",
        "experimentalHttpRoute.inferenceGatewayName",
        "inferenceObjectives",
    ):
        node = values
        for key in path.split("."):
            assert key in node, path
            node = node[key]
    assert values["inferencePool"]["targetPorts"] == [{"number": 8000}]


# --- every object valid, nothing upstream owns ---------------------------------------------------------


@functools.cache
def _kubernetes_problem(text: str) -> str | None:
    try:
        kubernetes_validate.validate(json.loads(text), KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return f"{exc.message} at {list(exc.path)}"
    return None


@pytest.mark.parametrize("case", CASES)
def test_every_object_validates(case: str) -> None:
    for obj in _render(case):
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if is_gie_kind(obj):
            continue  # test_the_gie_release_matrix
        if obj["kind"] in UNCHECKED.get(obj["apiVersion"], ()):
            continue
        if is_eg_kind(obj):
            assert eg_problems([obj]) == [], case
            continue
        problem = _kubernetes_problem(json.dumps(obj, sort_keys=True))
        assert problem is None, f"{case}: {where}: {problem}"


@pytest.mark.parametrize("case", CASES)
def test_the_gie_release_matrix(case: str) -> None:
    objects = _objects(case)
    assert [o for o in objects if is_gie_kind(o)]
    supported = SUPPORTED_RELEASES.get(case, V1_RELEASES)
    for release in GIE_RELEASES:
        problems = _gie_problems(objects, release)
        if release in supported:
            assert problems == [], f"{case} with GIE {release}'s CRDs"
        else:
            assert problems, f"{case} should not apply with GIE {release}'s CRDs"


def test_the_validators_refuse_a_misspelt_field() -> None:
    objects = _objects("default")
    deployment = _one(objects, "Deployment", PICKER)
    deployment["spec"]["replica"] = 3
    assert _kubernetes_problem(json.dumps(deployment)) is not None
    pool = _one(objects, "InferencePool", RELEASE)
    pool["spec"]["endpointPickerRef"]["portNumber"] = 9002
    assert _gie_problems([pool], "v1.6.0")


@pytest.mark.parametrize("case", CASES)
def test_no_crds_and_everything_in_the_release_namespace(case: str) -> None:
    for obj in _render(case):
        assert obj["kind"] not in ("CustomResourceDefinition", "Namespace")
        assert obj["metadata"]["namespace"] == NAMESPACE, f"{obj['kind']}/{obj['metadata']['name']}"
    assert not (CHART / "crds").exists()


# --- the config, the ports, the pool -------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_the_config_loads_and_discovers_the_pool(case: str, tmp_path: Path) -> None:
    objects = _objects(case)
    values = _values(case)
    config = _load_config(objects, tmp_path)
    pool = _one(objects, "InferencePool", RELEASE)
    assert config.pool.name == RELEASE
    discovery = config.pool.kubernetes
    assert discovery is not None
    assert (discovery.inference_pool, discovery.api_version) == (RELEASE, pool["apiVersion"])
    # The service account's namespace: the release's, where the Role lets it look and where the pool is.
    assert discovery.namespace is None
    assert (config.pool.endpoints, config.pool.endpoints_file) == ((), None)
    assert config.pool.target_port == _pool_ports(pool)[0]
    assert _pool_selector(pool) == values["inferencePool"]["modelServers"]["matchLabels"]
    assert _pool_ports(pool) == [p["number"] for p in values["inferencePool"]["targetPorts"]]
    name, port, failure_mode = _picker_ref(pool)
    assert failure_mode == config.pool.failure_mode.value
    service = _one(objects, "Service", name)
    (extproc,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc-ext-proc"]
    assert extproc["port"] == port == values["inferenceExtension"]["extProcPort"]
    assert config.collector.model_server == values["inferencePool"]["modelServerType"]
    assert config.collector.sharing is values["collector"]["sharing"]
    assert _one(objects, "Deployment", COLLECTOR)["spec"]["replicas"] == values["collector"]["replicas"]


def test_more_config_is_merged_under_what_the_chart_sets(tmp_path: Path) -> None:
    config = _load_config(_objects("models-and-objectives"), tmp_path)
    assert config.scheduling.kv_cache_threshold == 0.7
    assert config.collector.interval == 0.1
    assert config.picker.max_staleness == 1.0
    assert config.picker.health_listen == "0.0.0.0:9003"


def test_sentinel_renders_the_redis_sentinel_url() -> None:
    url = _redis_url(_objects("sentinel"))
    hosts = "sentinel-0.sentinel:26379,sentinel-1.sentinel:26379,sentinel-2.sentinel:26379"
    assert url == f"redis+sentinel://:s3cret@{hosts}/pointsman/2"
    assert not _find(_objects("sentinel"), "StatefulSet")


def test_the_services_read_the_sentinel_url(tmp_path: Path) -> None:
    target = _load_config(_objects("sentinel"), tmp_path).redis.target
    assert target == Sentinel(
        master_name="pointsman",
        hosts=(
            ("sentinel-0.sentinel", 26379),
            ("sentinel-1.sentinel", 26379),
            ("sentinel-2.sentinel", 26379),
        ),
        db=2,
        password="s3cret",
    )


def test_a_sentinel_password_is_percent_encoded_in_the_url(tmp_path: Path) -> None:
    password = "p@ss/w:rd %+"
    values = copy.deepcopy(CASES["sentinel"])
    values["redis"]["sentinel"]["password"] = password
    objects = _render_values(values)
    target = _load_config(objects, tmp_path).redis.target
    assert isinstance(target, Sentinel)
    assert target.password == password


def test_an_external_cluster_url_is_read_as_a_cluster(tmp_path: Path) -> None:
    values = {
        **CASES["default"],
        "redis": {"mode": "external", "external": {"url": "redis+cluster://n1:7000,n2"}},
    }
    objects = _render_values(values)
    assert _load_config(objects, tmp_path).redis.target == Cluster(nodes=(("n1", 7000), ("n2", 6379)))


@pytest.mark.parametrize("case", ["default", "external-redis", "external-redis-secret"])
def test_the_redis_url_is_where_the_values_say(case: str) -> None:
    objects = _objects(case)
    values = _values(case)["redis"]
    url = _redis_url(objects)
    if case == "default":
        assert url is not None
        password = base64.b64decode(_one(objects, "Secret", REDIS)["data"]["password"]).decode()
        assert len(password) == 32
        assert url == f"redis://:{password}@{REDIS}:6379/0"
        assert _one(objects, "Service", REDIS)["spec"]["ports"][0]["port"] == 6379
    elif values["external"]["url"]:
        assert url == values["external"]["url"]
    else:
        assert url is None
        for name in (PICKER, COLLECTOR):
            pod = _pod(objects, "Deployment", name)
            refs = [e["valueFrom"]["secretKeyRef"] for c in pod["containers"] for e in c.get("env", [])]
            assert {"name": "managed-redis", "key": "redis-url"} in refs
    if case != "default":
        assert not _find(objects, "StatefulSet")
        assert not _find(objects, "NetworkPolicy", REDIS)


@pytest.mark.parametrize("case", CASES)
def test_probes_and_ports_are_where_the_config_listens(case: str, tmp_path: Path) -> None:
    objects = _objects(case)
    config = _load_config(objects, tmp_path)
    picker_pod = _pod(objects, "Deployment", PICKER)
    picker = _container(picker_pod, "picker")
    assert picker["args"][:2] == ["--config", "/etc/pointsman/pointsman.yaml"]
    health = _port(config.picker.health_listen)
    assert picker["readinessProbe"]["grpc"]["port"] == health
    assert picker["livenessProbe"]["grpc"]["port"] == health
    # upstream's health service names, as the picker serves them
    assert (picker["readinessProbe"]["grpc"]["service"], picker["livenessProbe"]["grpc"]["service"]) == (
        "readiness",
        LIVENESS,
    )
    assert "readiness" in READINESS_SERVICES
    ports = {p["name"]: p["containerPort"] for c in picker_pod["containers"] for p in c.get("ports", [])}
    assert ports["metrics"] == _port(config.picker.metrics_listen)
    service = _one(objects, "Service", PICKER)
    (extproc,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc-ext-proc"]
    (metrics,) = [p for p in service["spec"]["ports"] if p["name"] == "http-metrics"]
    assert metrics["targetPort"] == "metrics"
    policy = _one(objects, "NetworkPolicy", PICKER)
    gateway_ports = [p["port"] for p in policy["spec"]["ingress"][0]["ports"]]
    if _values(case)["inferenceExtension"]["tls"]["enabled"]:
        # Through the sidecar only: the picker listens on loopback, where the sidecar passes ext_proc.
        proxy_map = _one(objects, "ConfigMap", f"{PICKER}-tls-proxy")
        proxy = yaml.safe_load(proxy_map["data"]["envoy.yaml"])
        (listener,) = proxy["static_resources"]["listeners"]
        (cluster,) = proxy["static_resources"]["clusters"]
        upstream = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        address = upstream["socket_address"]
        assert f"{address['address']}:{address['port_value']}" == config.picker.listen
        assert config.picker.listen.startswith("127.0.0.1:")
        tls_port = listener["address"]["socket_address"]["port_value"]
        assert extproc["targetPort"] == ports["extproc-tls"] == tls_port
        assert gateway_ports == [tls_port]
        sidecar = _container(picker_pod, "tls-proxy")
        mounts = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
        # The certificate comes by SDS from a file of the same ConfigMap, naming the Secret's files.
        served = listener["filter_chains"][0]["transport_socket"]["typed_config"]["common_tls_context"]
        (sds,) = served["tls_certificate_sds_secret_configs"]
        sds_path = Path(sds["sds_config"]["path_config_source"]["path"])
        assert sds_path.parent.as_posix() == mounts["tls-proxy"]
        (secret,) = yaml.safe_load(proxy_map["data"][sds_path.name])["resources"]
        assert secret["name"] == sds["name"]
        certificate = secret["tls_certificate"]
        assert certificate["certificate_chain"]["filename"] == f"{mounts['tls']}/tls.crt"
        assert certificate["watched_directory"]["path"] == mounts["tls"]
    else:
        assert not [c for c in picker_pod["containers"] if c["name"] == "tls-proxy"]
        assert extproc["targetPort"] == ports["grpc"] == _port(config.picker.listen)
        assert gateway_ports == [ports["grpc"]]
    collector_pod = _pod(objects, "Deployment", COLLECTOR)
    collector = _container(collector_pod, "collector")
    assert collector["args"][:2] == ["--config", "/etc/pointsman/pointsman.yaml"]
    (http,) = collector["ports"]
    assert http["containerPort"] == _port(config.collector.listen)
    assert collector["readinessProbe"]["httpGet"]["port"] == http["name"]
    for pod in (picker_pod, collector_pod):
        mounts = {m["name"]: m["mountPath"] for c in pod["containers"] for m in c.get("volumeMounts", [])}
        assert mounts["config"] == "/etc/pointsman"
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["config"]["configMap"]["name"] == f"{RELEASE}-config"


# --- RBAC and NetworkPolicies --------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["default", "v1alpha2"])
async def test_the_collector_s_role_allows_every_call_its_discovery_makes(case: str, tmp_path: Path) -> None:
    objects = _objects(case)
    discovery = _load_config(objects, tmp_path).pool.kubernetes
    assert discovery is not None
    assert discovery.inference_pool is not None
    pod = _pod(objects, "Deployment", COLLECTOR)
    assert pod.get("automountServiceAccountToken", True) is True  # discovery runs on its token
    binding = _one(objects, "RoleBinding", COLLECTOR)
    account = {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE}
    assert account in binding["subjects"]
    role = _one(objects, "Role", binding["roleRef"]["name"])
    pool = _one(objects, "InferencePool", discovery.inference_pool)
    # The first list, then both watches, each renewed: by then every kind of call has been made.
    api, targets = await discover_pool(
        pool, role, namespace=NAMESPACE, api_version=discovery.api_version, enough=12
    )
    assert api.forbidden == []
    assert targets.synced.is_set()
    group = discovery.api_version.split("/")[0]
    assert {(g, r) for _, g, r, _ in api.requests} == {("", "pods"), (group, "inferencepools")}
    assert {v for *_, v in api.requests} == {"get", "list", "watch"}
    # The watch of the cluster's objectives and rewrites too.
    cluster = await watch_cluster_objects(pool, role, namespace=NAMESPACE, api_version=discovery.api_version)
    assert cluster.forbidden == []
    # And no more than that.
    assert _role_permissions(role) == {
        (NAMESPACE, g, r, v)
        for g, r in (("", "pods"), (group, "inferencepools"))
        for v in ("get", "list", "watch")
    } | cluster_permissions(NAMESPACE)


@pytest.mark.parametrize(
    ("cluster_objects", "watched", "status"),
    [
        ({"source": "both"}, True, True),
        ({"source": "cluster", "writeStatus": False}, True, False),
        ({"source": "config"}, False, False),
    ],
)
def test_the_collector_s_role_grants_the_cluster_objects_only_as_used(
    cluster_objects: dict[str, Any], watched: bool, status: bool, tmp_path: Path
) -> None:
    objects = _render_values({**CASES["default"], "clusterObjects": cluster_objects})
    role = _one(objects, "Role", COLLECTOR)
    granted = {p for p in _role_permissions(role) if p[2].split("/")[0] in CLUSTER_RESOURCES}
    assert granted == (cluster_permissions(NAMESPACE, status=status) if watched else set())
    config = _load_config(objects, tmp_path)
    assert config.picker.cluster_objects == cluster_objects["source"]
    assert config.pool.kubernetes is not None
    assert config.pool.kubernetes.write_status is cluster_objects.get("writeStatus", True)


def test_the_picker_reads_no_kubernetes_api() -> None:
    objects = _objects("default")
    assert _pod(objects, "Deployment", PICKER)["automountServiceAccountToken"] is False
    assert [b["metadata"]["name"] for b in _find(objects, "RoleBinding")] == [COLLECTOR]


@pytest.mark.parametrize("case", CASES)
def test_network_policies_let_collectors_and_gateways_in_and_no_one_else(case: str) -> None:
    objects = _objects(case)
    pool = _one(objects, "InferencePool", RELEASE)
    collector = _pod_labels(objects, "Deployment", COLLECTOR)
    picker = _pod_labels(objects, "Deployment", PICKER)
    model_server = {**_pool_selector(pool), "pod-template-hash": "abc"}
    for port in _pool_ports(pool):
        assert _policies_allow(objects, "egress", collector, model_server, port)
    for api_port in (443, 6443):  # the kubernetes Service's port, and the API server's behind it
        assert _policies_allow(objects, "egress", collector, None, api_port)
    if _find(objects, "StatefulSet", REDIS):
        redis = _pod_labels(objects, "StatefulSet", REDIS)
        assert _policies_allow(objects, "egress", collector, redis, 6379)
        assert _policies_allow(objects, "egress", picker, redis, 6379)
        assert _policies_allow(objects, "ingress", redis, collector, 6379)
        assert _policies_allow(objects, "ingress", redis, picker, 6379)
        assert not _policies_allow(objects, "ingress", redis, model_server, 6379)
        assert not _policies_allow(objects, "ingress", redis, {"app.kubernetes.io/name": "picker"}, 6379)
    gateway = GATEWAY_PODS[_provider(case)]
    (extproc,) = _one(objects, "NetworkPolicy", PICKER)["spec"]["ingress"][0]["ports"]
    if gateway is None:
        assert _policies_allow(objects, "ingress", picker, model_server, extproc["port"])
    else:
        labels, namespace = gateway
        assert _policies_allow(objects, "ingress", picker, labels, extproc["port"], namespace=namespace)
        assert not _policies_allow(objects, "ingress", picker, model_server, extproc["port"])
    # Health stays open (it only says SERVING or NOT_SERVING); metrics, /v1/pool and the collector's
    # probes (the kubelet comes from the node: let in whatever the policies say) to the scrapers only.
    scraper, scrapers_namespace = SCRAPER_PODS[_provider(case)]
    assert _policies_allow(objects, "ingress", picker, model_server, 9003)
    for pod, port in ((picker, 9090), (collector, 9100)):
        assert _policies_allow(objects, "ingress", pod, scraper, port, namespace=scrapers_namespace)
        assert not _policies_allow(objects, "ingress", pod, model_server, port)
        assert not _policies_allow(objects, "ingress", pod, picker if pod is collector else collector, port)


def test_the_scrapers_can_be_named() -> None:
    peers = [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"team": "observability"}}}]
    objects = _render_values({**CASES["default"], "networkPolicy": {"enabled": True, "scraperPeers": peers}})
    for name in (PICKER, COLLECTOR):
        pod = _pod_labels(objects, "Deployment", name)
        port = 9090 if name == PICKER else 9100
        assert _policies_allow(objects, "ingress", pod, {"team": "observability"}, port, namespace="obs")
        prometheus, namespace = _PROMETHEUS
        assert not _policies_allow(objects, "ingress", pod, prometheus, port, namespace=namespace)


def test_mtls_makes_the_sidecar_require_a_client_certificate_from_the_secret_s_ca() -> None:
    objects = _objects("mtls")
    proxy_map = _one(objects, "ConfigMap", f"{PICKER}-tls-proxy")
    (listener,) = yaml.safe_load(proxy_map["data"]["envoy.yaml"])["static_resources"]["listeners"]
    tls = listener["filter_chains"][0]["transport_socket"]["typed_config"]
    assert tls["require_client_certificate"] is True
    sds = tls["common_tls_context"]["validation_context_sds_secret_config"]
    path = Path(sds["sds_config"]["path_config_source"]["path"])
    (secret,) = yaml.safe_load(proxy_map["data"][path.name])["resources"]
    assert secret["validation_context"]["trusted_ca"]["filename"] == "/etc/pointsman/tls/ca.crt"
    picker_pod = _pod(objects, "Deployment", PICKER)
    volumes = {v["name"]: v for v in picker_pod["volumes"]}
    assert (
        volumes["tls"]["secret"]["secretName"] == CASES["mtls"]["inferenceExtension"]["tls"]["existingSecret"]
    )
    # Without mTLS, no client certificate is asked for.
    plain = yaml.safe_load(
        _one(_objects("default"), "ConfigMap", f"{PICKER}-tls-proxy")["data"]["envoy.yaml"]
    )
    typed = plain["static_resources"]["listeners"][0]["filter_chains"][0]["transport_socket"]["typed_config"]
    assert "require_client_certificate" not in typed


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"tls": {"clientAuth": {"enabled": True}}}, "needs inferenceExtension.tls.existingSecret"),
        (
            {"tls": {"enabled": False, "existingSecret": "x", "clientAuth": {"enabled": True}}},
            "needs inferenceExtension.tls.enabled",
        ),
    ],
)
def test_mtls_needs_tls_and_a_ca_of_your_own(values: dict[str, Any], message: str) -> None:
    with pytest.raises(Exception, match=message):
        _render_values({**CASES["default"], "inferenceExtension": values})


# --- pods ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_every_pod_meets_the_restricted_pod_security_standard(case: str) -> None:
    workloads = [o for o in _render(case) if o["kind"] in ("Deployment", "StatefulSet")]
    assert len(workloads) >= 2
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        assert restricted_pod_problems(pod) == [], workload["metadata"]["name"]
        for container in pod["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, container["name"]


def test_restricted_pod_problems_reads_the_standard() -> None:
    pod = copy.deepcopy(_pod(_objects("default"), "Deployment", PICKER))
    pod["securityContext"]["runAsNonRoot"] = False
    pod["containers"][0]["securityContext"]["capabilities"] = {"add": ["NET_ADMIN"]}
    pod["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    problems = restricted_pod_problems(pod)
    assert len([p for p in problems if "runAsNonRoot" in p]) == len(pod["containers"])
    assert any("drop ALL" in p for p in problems)
    assert any("NET_ADMIN" in p for p in problems)
    assert any("hostPath" in p for p in problems)


def test_the_pickers_have_replicas_a_pdb_and_no_hpa_by_default() -> None:
    objects = _objects("default")
    assert _one(objects, "Deployment", PICKER)["spec"]["replicas"] == 3
    assert not _find(objects, "HorizontalPodAutoscaler")
    pdb = _one(objects, "PodDisruptionBudget", PICKER)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert (
        pdb["spec"]["selector"]["matchLabels"].items() <= _pod_labels(objects, "Deployment", PICKER).items()
    )


def test_with_the_hpa_the_pickers_replicas_are_its() -> None:
    objects = _objects("hpa")
    deployment = _one(objects, "Deployment", PICKER)
    assert "replicas" not in deployment["spec"]
    hpa = _one(objects, "HorizontalPodAutoscaler", PICKER)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": PICKER}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    assert hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] == 60
    # A drain can always evict one picker.
    assert _one(objects, "PodDisruptionBudget", PICKER)["spec"]["maxUnavailable"] >= 1


# --- TLS -----------------------------------------------------------------------------------------------


def _openssl(*args: str) -> str:
    return subprocess.run(["openssl", *args], check=True, capture_output=True, text=True).stdout


def test_the_certificate_the_chart_makes_is_the_picker_service_s(tmp_path: Path) -> None:
    objects = _objects("default")
    secret = _one(objects, "Secret", f"{PICKER}-tls")
    assert secret["type"] == "kubernetes.io/tls"
    for key, data in secret["data"].items():
        (tmp_path / key).write_bytes(base64.b64decode(data))
    assert (
        _openssl("verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "tls.crt"))
        .strip()
        .endswith("OK")
    )
    names = _openssl("x509", "-in", str(tmp_path / "tls.crt"), "-noout", "-ext", "subjectAltName")
    for name in (PICKER, f"{PICKER}.{NAMESPACE}.svc", f"{PICKER}.{NAMESPACE}.svc.cluster.local"):
        assert f"DNS:{name}," in f"{names.strip()},"
    key = _openssl("pkey", "-in", str(tmp_path / "tls.key"), "-pubout")
    assert key == _openssl("x509", "-in", str(tmp_path / "tls.crt"), "-noout", "-pubkey")
    volumes = {v["name"]: v for v in _pod(objects, "Deployment", PICKER)["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == secret["metadata"]["name"]


def test_an_existing_certificate_is_mounted_not_made() -> None:
    objects = _objects("tls-existing-secret")
    assert not [s for s in _find(objects, "Secret") if s["type"] == "kubernetes.io/tls"]
    volumes = {v["name"]: v for v in _pod(objects, "Deployment", PICKER)["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "picker-tls-from-cert-manager"


# --- models, objectives, monitoring, dashboards --------------------------------------------------------


def test_the_objectives_and_models_are_the_config_s(tmp_path: Path) -> None:
    objects = _objects("models-and-objectives")
    config = _load_config(objects, tmp_path)
    values = CASES["models-and-objectives"]
    declared = {
        o["metadata"]["name"]: (o["spec"]["priority"], o["spec"]["poolRef"])
        for o in _find(objects, "InferenceObjective")
    }
    pool_ref = {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": RELEASE}
    assert declared == {o.name: (o.priority, pool_ref) for o in config.objectives}
    assert [o.model_dump() for o in config.objectives] == values["inferenceObjectives"]
    assert [m.model_name for m in config.models] == [m["modelName"] for m in values["models"]]
    assert not _find(objects, "InferenceModel")


def test_the_inference_model_rewrites_are_the_config_s_models_rewrites(tmp_path: Path) -> None:
    # The picker reads the rewrites from its config; with inferenceModelRewrites.enabled the chart
    # mirrors them for the cluster's other GIE-aware consumers: one object per model with targetModels.
    objects = _objects("model-rewrites")
    config = _load_config(objects, tmp_path)
    pool_ref = {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": RELEASE}
    declared = {}
    for rewrite in _find(objects, "InferenceModelRewrite"):
        assert rewrite["spec"]["poolRef"] == pool_ref
        (rule,) = rewrite["spec"]["rules"]
        (match,) = rule["matches"]
        assert match["model"]["type"] == "Exact"
        declared[match["model"]["value"]] = rule["targets"]
    assert declared == {
        m.model_name: [
            {"modelRewrite": t.name, **({"weight": t.weight} if t.weight is not None else {})}
            for t in m.target_models
        ]
        for m in config.models
        if m.target_models
    }
    assert [m.model_name for m in config.models] == [
        m["modelName"] for m in CASES["model-rewrites"]["models"]
    ]
    assert not _find(objects, "InferenceObjective")
    # Off by default, as upstream's optional objects: the same models, no rewrite objects.
    assert not _find(_objects("models-and-objectives"), "InferenceModelRewrite")


def test_a_v1alpha2_pool_gets_the_models_as_inference_models(tmp_path: Path) -> None:
    objects = _objects("v1alpha2")
    config = _load_config(objects, tmp_path)
    declared = {m["spec"]["modelName"]: m["spec"] for m in _find(objects, "InferenceModel")}
    assert list(declared) == [m.model_name for m in config.models]
    for model in config.models:
        spec = declared[model.model_name]
        assert (spec["criticality"] == "Critical") is model.critical
        assert spec["poolRef"] == {"name": RELEASE}
        assert spec.get("targetModels", []) == [t.model_dump(exclude_none=True) for t in model.target_models]
    assert not _find(objects, "InferenceObjective")


def test_the_monitors_select_the_services_and_pods_the_dashboards_chart() -> None:
    objects = _objects("models-and-objectives")
    for component, name, port in (("picker", PICKER, "http-metrics"), ("collector", COLLECTOR, "http")):
        monitor = _one(objects, "ServiceMonitor", f"{RELEASE}-{component}")
        service = _one(objects, "Service", name)
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        # The dashboards select job="picker" and job="collector".
        assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == component
        assert port in [p["name"] for p in service["spec"]["ports"]]
        assert [e["port"] for e in monitor["spec"]["endpoints"]] == [port]
    assert (
        _one(objects, "ServiceMonitor", f"{RELEASE}-picker")["metadata"]["labels"]["release"]
        == "kube-prometheus-stack"
    )
    pods = _one(objects, "PodMonitor", f"{RELEASE}-model-servers")
    pool = _one(objects, "InferencePool", RELEASE)
    assert pods["spec"]["selector"]["matchLabels"] == _pool_selector(pool)
    (endpoint,) = pods["spec"]["podMetricsEndpoints"]
    assert {"action": "replace", "targetLabel": "job", "replacement": "pods"} in endpoint["relabelings"]
    assert not _find(_objects("default"), "ServiceMonitor")
    # GKE: Managed Prometheus, whose job label is the PodMonitoring's name.
    gke = _objects("gke")
    assert not _find(gke, "ServiceMonitor")
    for component, name in (("picker", PICKER), ("collector", COLLECTOR)):
        monitoring = _one(gke, "PodMonitoring", component)
        assert (
            monitoring["spec"]["selector"]["matchLabels"].items()
            <= _pod_labels(gke, "Deployment", name).items()
        )


def test_the_dashboards_are_the_repository_s() -> None:
    config_map = _one(_objects("default"), "ConfigMap", f"{RELEASE}-grafana-dashboards")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["data"] == {p.name: p.read_text(encoding="utf-8") for p in DASHBOARDS.glob("*.json")}


# --- providers -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case", [c for c in CASES if CASES[c].get("experimentalHttpRoute", {}).get("enabled")]
)
def test_the_http_route_sends_to_the_pool(case: str) -> None:
    objects = _objects(case)
    route = _one(objects, "HTTPRoute", RELEASE)
    (parent,) = route["spec"]["parentRefs"]
    assert (parent["kind"], parent["name"]) == (
        "Gateway",
        _values(case)["experimentalHttpRoute"]["inferenceGatewayName"],
    )
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    pool = _one(objects, "InferencePool", backend["name"])
    assert (backend["group"], backend["kind"]) == (pool["apiVersion"].split("/")[0], "InferencePool")
    # v1: no port, the pool's targetPorts say where its pods listen; v1alpha2 routes name the one port.
    assert backend.get("port") in (None, *_pool_ports(pool))
    assert ("port" in backend) is (pool["apiVersion"] != "inference.networking.k8s.io/v1")
    assert ("timeouts" in rule) is (_provider(case) != "gke")


def test_envoy_gateway_objects_point_at_the_pool_and_the_picker(tmp_path: Path) -> None:
    objects = _objects("envoy-gateway")
    config = _load_config(objects, tmp_path)
    route = _one(objects, "HTTPRoute", RELEASE)
    (parent,) = route["spec"]["parentRefs"]
    extension = _one(objects, "EnvoyExtensionPolicy", f"{PICKER}-ext-proc")
    for policy in (extension, _one(objects, "BackendTrafficPolicy", RELEASE)):
        assert policy["spec"]["targetRefs"] == [
            {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": RELEASE}
        ]
    ((picker,),) = [p["backendRefs"] for p in extension["spec"]["extProc"]]
    service = _one(objects, "Service", picker["name"])
    assert picker["port"] in [p["port"] for p in service["spec"]["ports"]]
    assert extension["spec"]["extProc"][0]["processingMode"]["request"]["body"] == "Buffered"
    assert extension["spec"]["extProc"][0]["failOpen"] is False
    patch = _one(objects, "EnvoyPatchPolicy", f"{PICKER}-original-dst")
    assert patch["spec"]["targetRef"]["name"] == parent["name"]
    names = {p["name"] for p in patch["spec"]["jsonPatches"]}
    assert f"{NAMESPACE}/{parent['name']}/{parent['sectionName']}" in names
    assert f"envoyextensionpolicy/{NAMESPACE}/{extension['metadata']['name']}/extproc/0" in names
    (cluster,) = [
        p["operation"]["value"]
        for p in patch["spec"]["jsonPatches"]
        if p["name"] == "original_destination_cluster"
    ]
    assert cluster["type"] == "ORIGINAL_DST"
    assert cluster["original_dst_lb_config"]["http_header_name"] == config.picker.destination_header
    proxy = envoy_gateway_usage_path(objects, extension, tls=True)
    assert proxy["spec"]["mergeType"] == "StrategicMerge"
    # Without the patch policy (Envoy Gateway builds ext_proc from the InferencePool): none of it.
    plain = _objects("default+envoy-gateway")
    for kind in ("EnvoyExtensionPolicy", "EnvoyPatchPolicy", "EnvoyProxy"):
        assert not _find(plain, kind)


def test_the_envoy_gateway_usage_path_matches_the_overlay_s() -> None:
    # The chart's EnvoyProxy is the overlay's but for the names the release gives.
    from test_deploy_k8s import _objects as overlay_objects

    (overlay,) = copy.deepcopy(_find(overlay_objects("overlays/envoy-gateway"), "EnvoyProxy"))
    (chart,) = _find(_objects("envoy-gateway"), "EnvoyProxy")
    names = {"pointsman-picker": PICKER}
    for setting in overlay["spec"]["telemetry"]["accessLog"]["settings"]:
        for sink in setting["sinks"]:
            for ref in sink.get("als", {}).get("backendRefs", []):
                ref["name"] = names[ref["name"]]
    assert chart["spec"] == overlay["spec"]


def test_without_usage_the_picker_sees_the_response_headers_and_nothing_more() -> None:
    objects = _objects("envoy-gateway-no-usage")
    (ext_proc,) = _one(objects, "EnvoyExtensionPolicy", f"{PICKER}-ext-proc")["spec"]["extProc"]
    assert ext_proc["processingMode"]["response"] == {}
    assert "metadata" not in ext_proc
    assert "lua" not in _one(objects, "EnvoyExtensionPolicy", f"{PICKER}-ext-proc")["spec"]
    assert not _find(objects, "EnvoyProxy")
    assert not [o for o in _find(objects, "ConfigMap") if o["metadata"]["name"].endswith("usage-lua")]
    patches = _one(objects, "EnvoyPatchPolicy", f"{PICKER}-original-dst")["spec"]["jsonPatches"]
    assert "accesslog_als_0_0" not in {p["name"] for p in patches}


def test_without_tls_no_cluster_gets_a_tls_patch() -> None:
    values = {**CASES["envoy-gateway"], "inferenceExtension": {"tls": {"enabled": False}}}
    objects = _render_values(values)
    envoy_gateway_usage_path(objects, _one(objects, "EnvoyExtensionPolicy", f"{PICKER}-ext-proc"), tls=False)


@pytest.mark.parametrize("case", ["gke", "default+gke"])
def test_gke_policies_target_the_pool(case: str) -> None:
    objects = _objects(case)
    pool = _one(objects, "InferencePool", RELEASE)
    target = {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": RELEASE}
    health = _one(objects, "HealthCheckPolicy", RELEASE)
    assert health["spec"]["targetRef"] == target
    assert health["spec"]["default"]["config"]["httpHealthCheck"]["port"] in _pool_ports(pool)
    assert _one(objects, "GCPBackendPolicy", RELEASE)["spec"]["targetRef"] == target


@pytest.mark.parametrize("case", ["istio", "default+istio"])
def test_the_istio_destination_rule_is_the_picker_s(case: str) -> None:
    objects = _objects(case)
    rule = _one(objects, "DestinationRule", PICKER)
    assert rule["spec"]["host"] == f"{PICKER}.{NAMESPACE}.svc.cluster.local"
    assert rule["spec"]["trafficPolicy"]["tls"] == {"mode": "SIMPLE", "insecureSkipVerify": True}
    configured = CASES[case]["provider"].get("istio", {}).get("destinationRule", {}).get("trafficPolicy", {})
    assert configured.items() <= rule["spec"]["trafficPolicy"].items()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_only_the_provider_s_objects_are_rendered(provider: str) -> None:
    case = "default" if provider == "none" else f"default+{provider}"
    kinds = {o["kind"] for o in _render(case)}
    own = {
        "gke": {"HealthCheckPolicy", "GCPBackendPolicy"},
        "istio": {"DestinationRule"},
        "envoy-gateway": {"BackendTrafficPolicy"},
    }
    for other, other_kinds in own.items():
        assert (other_kinds <= kinds) is (other == provider), other


def test_tracing_is_one_setting_away_and_off_by_default(tmp_path: Path) -> None:
    assert _load_config(_objects("default"), tmp_path).tracing.enabled is False
    tracing = _load_config(_objects("tracing"), tmp_path).tracing
    assert (tracing.enabled, tracing.endpoint, tracing.protocol) == (
        True,
        "http://otel-collector.observability:4317",
        "grpc",
    )
    assert (tracing.sampler, tracing.ratio) == ("parentbased_traceidratio", 0.25)


# --- the chart's files/ ---------------------------------------------------------------------------


def _chart_files() -> list[tuple[Path, Path]]:
    """The Makefile's CHART_FILES: (copy in the chart, its source)."""
    return makefile_copies("CHART_FILES", CHART)


def test_the_chart_has_no_symlinks() -> None:
    chart = REPO / "deploy/helm/pointsman"
    assert [p for p in chart.rglob("*") if p.is_symlink()] == []


@pytest.mark.parametrize(("copy", "source"), _chart_files(), ids=lambda p: p.name)
def test_each_chart_file_is_a_copy_of_its_source(copy: Path, source: Path) -> None:
    assert file_tree(copy) == file_tree(source), f"run `make chart-files`: {copy.name} differs from {source}"


def test_every_file_in_files_is_one_the_makefile_copies() -> None:
    copied = {copy.name for copy, _ in _chart_files()}
    assert {p.name for p in (REPO / "deploy/helm/pointsman/files").iterdir()} == copied
