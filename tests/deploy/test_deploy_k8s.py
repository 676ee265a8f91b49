"""deploy/k8s: every overlay builds with `kubectl kustomize`, every object validates against the Kubernetes
schemas (kubernetes-validate, offline) or our CRDs' schemas, and the pieces agree with each other: the
Pointsman config parses and discovers the InferencePool whose selector matches the overlay's pods, the
collector's Role and the NetworkPolicies allow what its discovery does, the InferenceModels are the
config's models, the gateway objects point at the picker Service and the pool."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml
from deploy_kit import REPO

from pointsman_collector.kubernetes import KubeAccess, KubernetesTargets
from pointsman_devstack.stack import served_models
from pointsman_shared.config import PointsmanConfig, load_config, parse_config

K8S = REPO / "deploy/k8s"
OVERLAYS = ("sim", "vllm", "envoy-gateway", "standalone-envoy")
POOL_OVERLAYS = ("sim", "vllm")
KUBERNETES_VERSION = "1.33"
# Kinds from other projects' CRDs: checked here by what refers to what, not by schema.
THIRD_PARTY = {
    "monitoring.coreos.com/v1": {"ServiceMonitor", "PodMonitor"},
    "gateway.networking.k8s.io/v1": {"GatewayClass", "Gateway", "HTTPRoute"},
    "gateway.envoyproxy.io/v1alpha1": {"EnvoyExtensionPolicy", "EnvoyPatchPolicy", "BackendTrafficPolicy"},
}
Objects = list[dict[str, Any]]


@functools.cache
def _build(target: str) -> tuple[dict[str, Any], ...]:
    kubectl = Path(sys.executable).parent / "kubectl"
    result = subprocess.run(
        [str(kubectl), "kustomize", str(K8S / target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def _objects(target: str) -> Objects:
    return list(_build(target))


def _find(objects: Objects, kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]


def _one(objects: Objects, kind: str, name: str) -> dict[str, Any]:
    (found,) = _find(objects, kind, name)
    return found


def _crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    schemas = {}
    for crd in _find(_objects("base"), "CustomResourceDefinition"):
        for version in crd["spec"]["versions"]:
            api_version = f"{crd['spec']['group']}/{version['name']}"
            schemas[(api_version, crd["spec"]["names"]["kind"])] = version["schema"]["openAPIV3Schema"]
    return schemas


def _pointsman_config(objects: Objects) -> PointsmanConfig:
    (config_map,) = [
        o for o in _find(objects, "ConfigMap") if o["metadata"]["name"].startswith("pointsman-config")
    ]
    return parse_config(yaml.safe_load(config_map["data"]["pointsman.yaml"]), source="pointsman-config")


@pytest.mark.parametrize("target", ["base", *[f"overlays/{o}" for o in OVERLAYS]])
def test_builds_and_every_object_validates(target: str) -> None:
    crds = _crd_schemas()
    unchecked = []
    for obj in _objects(target):
        key = (obj["apiVersion"], obj["kind"])
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if key in crds:
            jsonschema.validate(obj, crds[key])
        elif obj["kind"] in THIRD_PARTY.get(obj["apiVersion"], ()):
            unchecked.append(where)
        else:
            try:
                kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{target}: {where}: {exc.message} at {list(exc.path)}")
    assert all(u.split("/")[0] in set().union(*THIRD_PARTY.values()) for u in unchecked)


def test_the_validator_rejects_a_misspelt_field() -> None:
    deployment = dict(_one(_objects("base"), "Deployment", "pointsman-picker"))
    deployment["spec"] = {**deployment["spec"], "replica": 3}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_the_crd_schema_rejects_a_bad_criticality() -> None:
    model = _one(_objects("base"), "InferenceModel", "sql-lora")
    bad = {**model, "spec": {**model["spec"], "criticality": "Important"}}
    schema = _crd_schemas()[("inference.networking.x-k8s.io/v1alpha2", "InferenceModel")]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


@pytest.mark.parametrize("target", ["base", *[f"overlays/{o}" for o in POOL_OVERLAYS]])
def test_the_pointsman_config_parses_and_matches_the_inference_models(target: str) -> None:
    objects = _objects(target)
    config = _pointsman_config(objects)
    pool = _one(objects, "InferencePool", config.pool.name)
    assert pool["spec"]["targetPortNumber"] == config.pool.target_port
    declared = {
        m["spec"]["modelName"]: (m["spec"].get("criticality"), m["spec"].get("targetModels", []))
        for m in _find(objects, "InferenceModel")
    }
    configured = {
        m.model_name: (
            m.criticality.value if m.criticality else None,
            [t.model_dump(exclude_none=True) for t in m.target_models],
        )
        for m in config.models
    }
    assert declared == configured
    assert {m["spec"]["poolRef"]["name"] for m in _find(objects, "InferenceModel")} == {config.pool.name}


@pytest.mark.parametrize("target", ["base", *[f"overlays/{o}" for o in POOL_OVERLAYS]])
def test_the_collectors_discover_the_inference_pool_and_share_it(target: str) -> None:
    objects = _objects(target)
    config = _pointsman_config(objects)
    discovery = config.pool.kubernetes
    assert discovery is not None
    # No address in the config: the pods come and go with the cluster.
    assert (config.pool.endpoints, config.pool.endpoints_file) == ((), None)
    pool = _one(objects, "InferencePool", discovery.inference_pool or config.pool.name)
    assert pool["apiVersion"] == discovery.api_version
    # The service account's namespace, where the Role lets it look and where the pool is.
    assert discovery.namespace in (None, pool["metadata"]["namespace"])
    assert config.collector.sharing is True
    assert _one(objects, "Deployment", "pointsman-collector")["spec"]["replicas"] >= 2


@pytest.mark.parametrize("overlay", POOL_OVERLAYS)
def test_the_pool_selects_the_overlay_s_model_servers_on_their_port(overlay: str) -> None:
    objects = _objects(f"overlays/{overlay}")
    pool = _one(objects, "InferencePool", _pointsman_config(objects).pool.name)
    # A Deployment: the pool follows its pods wherever they are, no per-pod Service or fixed address.
    template = _one(objects, "Deployment", "model-server")["spec"]["template"]
    assert pool["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    ports = [p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])]
    assert pool["spec"]["targetPortNumber"] in ports
    assert not [s for s in _find(objects, "Service") if s["metadata"]["name"].startswith("model-server")]


class RecordingApi:
    """Just enough of the Kubernetes API for the collector's discovery to run against: the rendered
    InferencePool, no pods, watches that end at once. Records each request as the RBAC permission it
    needs: (namespace, API group, resource, verb)."""

    def __init__(self, pool: dict[str, Any], *, enough: int) -> None:
        self._pool = {**pool, "metadata": {**pool["metadata"], "resourceVersion": "1"}}
        self.requests: list[tuple[str, str, str, str]] = []
        self._enough = enough
        self.seen_enough = asyncio.Event()  # set once ``enough`` requests have come
        self._answering: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> RecordingApi:
        self._server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        # Let the answers in flight end (Python 3.11's server reports a cancelled one as an error).
        await asyncio.gather(*self._answering)

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)
        _method, target, _version = (await reader.readline()).decode().split(" ")
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        url = urlsplit(target)
        watch = parse_qs(url.query).get("watch") == ["1"]
        # /api/v1/namespaces/NS/RESOURCE[/NAME] or /apis/GROUP/VERSION/namespaces/NS/RESOURCE[/NAME]
        parts = url.path.strip("/").split("/")
        group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
        _namespaces, namespace, resource, *name = rest
        verb = "get" if name else "watch" if watch else "list"
        self.requests.append((namespace, group, resource, verb))
        if len(self.requests) >= self._enough:
            self.seen_enough.set()
        if watch:
            await asyncio.sleep(0.05)  # an empty watch the server ended: the client watches again
            body = b""
        elif resource == "inferencepools":
            body = json.dumps(self._pool).encode()
        else:
            body = json.dumps({"items": [], "metadata": {"resourceVersion": "1"}}).encode()
        with contextlib.suppress(ConnectionError):  # the client may have gone meanwhile
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
        writer.close()


@pytest.mark.parametrize("overlay", POOL_OVERLAYS)
async def test_the_collector_s_role_allows_every_call_its_discovery_makes(overlay: str) -> None:
    objects = _objects(f"overlays/{overlay}")
    config = _pointsman_config(objects)
    discovery = config.pool.kubernetes
    assert discovery is not None
    collector = _one(objects, "Deployment", "pointsman-collector")
    namespace = collector["metadata"]["namespace"]
    pod = collector["spec"]["template"]["spec"]
    assert pod.get("automountServiceAccountToken", True) is True  # discovery runs on its token
    binding = _one(objects, "RoleBinding", "pointsman-collector")
    account = {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": namespace}
    assert account in binding["subjects"]
    role = _one(objects, "Role", binding["roleRef"]["name"])
    assert role["metadata"]["namespace"] == namespace
    pool_name = discovery.inference_pool or config.pool.name
    # The first list, then both watches, each renewed: by then every kind of call has been made.
    async with RecordingApi(_one(objects, "InferencePool", pool_name), enough=12) as api:
        access = KubeAccess(server=api.url, namespace=discovery.namespace or namespace)
        targets = KubernetesTargets(
            access, pool=pool_name, api_version=discovery.api_version, on_change=lambda _pods: None
        )
        follow = asyncio.create_task(targets.run())
        try:
            async with asyncio.timeout(30):
                await api.seen_enough.wait()
        finally:
            follow.cancel()
            await asyncio.gather(follow, return_exceptions=True)
    assert targets.synced.is_set()
    allowed = {
        (namespace, group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    needed = set(api.requests)
    assert {r for _, _, r, _ in needed} == {"pods", "inferencepools"}
    assert needed <= allowed, needed - allowed


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert "matchExpressions" not in selector  # none here; this check reads matchLabels only
    match_labels: dict[str, str] = selector.get("matchLabels", {})
    return match_labels.items() <= labels.items()


def _policies_allow(
    objects: Objects, direction: str, pod: dict[str, str], peer: dict[str, str] | None, port: int
) -> bool:
    """Whether the NetworkPolicies let ``pod`` (its labels) receive (``ingress``) from or send
    (``egress``) to ``peer`` (a pod's labels, same namespace; ``None``: an address outside the cluster,
    e.g. the API server) on TCP ``port``. No policy of that direction selecting ``pod``: allowed."""
    policies = [
        p["spec"]
        for p in _find(objects, "NetworkPolicy")
        if direction.capitalize() in p["spec"].get("policyTypes", ["Ingress"])
        and _selects(p["spec"]["podSelector"], pod)
    ]
    rules = [rule for policy in policies for rule in policy.get(direction, [])]
    for rule in rules:
        if rule.get("ports") and port not in [p.get("port") for p in rule["ports"]]:
            continue
        peers = rule.get("from" if direction == "ingress" else "to")
        if not peers:
            return True
        for candidate in peers:
            if peer is None and "ipBlock" in candidate:
                return True
            if peer is not None and "podSelector" in candidate and _selects(candidate["podSelector"], peer):
                return True
    return not policies


_POD = {"app": "a"}
_OTHER = {"app": "b"}


def _policy(direction: str, *rules: dict[str, Any]) -> dict[str, Any]:
    spec = {
        "podSelector": {"matchLabels": _POD},
        "policyTypes": [direction.capitalize()],
        direction: list(rules),
    }
    return {"kind": "NetworkPolicy", "metadata": {"name": "p"}, "spec": spec}


_API_443 = {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 443}]}
_FROM_OTHER = {"from": [{"podSelector": {"matchLabels": _OTHER}}]}


@pytest.mark.parametrize(
    ("policies", "direction", "peer", "port", "allowed"),
    [
        ([], "egress", None, 443, True),
        ([_policy("egress")], "egress", None, 443, False),  # default deny
        ([_policy("egress", _API_443)], "egress", None, 443, True),
        ([_policy("egress", _API_443)], "egress", None, 6443, False),
        ([_policy("ingress", _FROM_OTHER)], "ingress", _OTHER, 8000, True),
        ([_policy("ingress", _FROM_OTHER)], "ingress", {"app": "c"}, 8000, False),
        ([_policy("ingress", {"ports": [{"port": 9090}]})], "ingress", _OTHER, 8000, False),
    ],
)
def test_the_network_policy_reading(
    policies: Objects, direction: str, peer: dict[str, str] | None, port: int, allowed: bool
) -> None:
    assert _policies_allow(policies, direction, _POD, peer, port) is allowed


@pytest.mark.parametrize("overlay", POOL_OVERLAYS)
def test_network_policies_let_the_collectors_reach_the_api_the_pods_and_redis(overlay: str) -> None:
    # Everything one namespace gets: a pool overlay and the gateway overlays.
    objects = [*_objects(f"overlays/{overlay}"), *_objects("overlays/standalone-envoy")]
    objects += _objects("overlays/envoy-gateway")
    pool = _one(objects, "InferencePool", _pointsman_config(objects).pool.name)
    collector = _one(objects, "Deployment", "pointsman-collector")["spec"]["template"]["metadata"]["labels"]
    model_server = _one(objects, "Deployment", "model-server")["spec"]["template"]["metadata"]["labels"]
    redis = _one(objects, "StatefulSet", "pointsman-redis")["spec"]["template"]["metadata"]["labels"]
    port = pool["spec"]["targetPortNumber"]
    assert _policies_allow(objects, "egress", collector, model_server, port)
    assert _policies_allow(objects, "ingress", model_server, collector, port)
    for api_port in (443, 6443):  # the kubernetes Service's port, and the API server's behind it
        assert _policies_allow(objects, "egress", collector, None, api_port)
    assert _policies_allow(objects, "egress", collector, redis, 6379)
    assert _policies_allow(objects, "ingress", redis, collector, 6379)


def test_vllm_serves_the_adapters_with_four_lora_slots_on_a_gpu() -> None:
    objects = _objects("overlays/vllm")
    (container,) = _one(objects, "Deployment", "model-server")["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert "--enable-lora" in args
    assert "--max-loras=4" in args
    modules = args[args.index("--lora-modules") + 1 :]
    _base, adapters = served_models(_pointsman_config(objects))
    assert [m.split("=")[0] for m in modules] == list(adapters)
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "1"


def test_picker_is_reached_only_through_its_tls_sidecar() -> None:
    objects = _objects("base")
    config = _pointsman_config(objects)
    assert config.picker.listen.startswith("127.0.0.1:")
    proxy = yaml.safe_load(
        next(
            o
            for o in _find(objects, "ConfigMap")
            if o["metadata"]["name"].startswith("pointsman-picker-tls-proxy")
        )["data"]["envoy.yaml"]
    )
    (cluster,) = proxy["static_resources"]["clusters"]
    address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    assert (
        f"{address['socket_address']['address']}:{address['socket_address']['port_value']}"
        == config.picker.listen
    )
    (listener,) = proxy["static_resources"]["listeners"]
    tls_port = listener["address"]["socket_address"]["port_value"]
    service = _one(objects, "Service", "pointsman-picker")
    (extproc,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc-extproc"]
    pod = _one(objects, "Deployment", "pointsman-picker")["spec"]["template"]["spec"]
    ports = {p["name"]: p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])}
    assert ports[extproc["targetPort"]] == tls_port
    pool = _one(objects, "InferencePool", config.pool.name)
    assert (pool["spec"]["extensionRef"]["name"], pool["spec"]["extensionRef"]["portNumber"]) == (
        "pointsman-picker",
        extproc["port"],
    )
    policy = _one(objects, "NetworkPolicy", "pointsman-picker")
    gateway_ports = [p["port"] for rule in policy["spec"]["ingress"] if "from" in rule for p in rule["ports"]]
    assert gateway_ports == [tls_port]


def test_picker_has_grpc_probes_an_hpa_and_a_pdb() -> None:
    objects = _objects("base")
    deployment = _one(objects, "Deployment", "pointsman-picker")
    assert deployment["spec"]["replicas"] == 3
    (picker,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "picker"]
    assert "grpc" in picker["readinessProbe"]
    assert "grpc" in picker["livenessProbe"]
    hpa = _one(objects, "HorizontalPodAutoscaler", "pointsman-picker")
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    pdb = _one(objects, "PodDisruptionBudget", "pointsman-picker")
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]
    collector = _one(objects, "Deployment", "pointsman-collector")
    assert collector["spec"]["replicas"] == 2
    rules = _one(objects, "Role", "pointsman-collector")["rules"]
    assert {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]} == {
        ("", "pods"),
        ("inference.networking.x-k8s.io", "inferencepools"),
    }
    assert all(rule["verbs"] == ["get", "list", "watch"] for rule in rules)


def test_only_the_collector_and_pickers_reach_redis() -> None:
    policy = _one(_objects("base"), "NetworkPolicy", "pointsman-redis")
    (rule,) = policy["spec"]["ingress"]
    assert sorted(p["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for p in rule["from"]) == [
        "collector",
        "picker",
    ]


def test_every_container_runs_non_root_with_a_read_only_root() -> None:
    for target in ("overlays/sim", "overlays/standalone-envoy"):
        for workload in _objects(target):
            if workload["kind"] not in ("Deployment", "StatefulSet"):
                continue
            pod = workload["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True
            for container in pod["containers"]:
                assert container["securityContext"]["readOnlyRootFilesystem"] is True, container["name"]


def test_envoy_gateway_objects_point_at_the_pool_and_the_picker() -> None:
    objects = _objects("overlays/envoy-gateway")
    base = _objects("base")
    gateway = _one(objects, "Gateway", "inference-gateway")
    (listener,) = gateway["spec"]["listeners"]
    route = _one(objects, "HTTPRoute", "llm-route")
    ((backend,),) = [rule["backendRefs"] for rule in route["spec"]["rules"]]
    assert (backend["group"], backend["kind"]) == ("inference.networking.x-k8s.io", "InferencePool")
    _one(base, "InferencePool", backend["name"])
    extension = _one(objects, "EnvoyExtensionPolicy", "pointsman-ext-proc")
    ((picker,),) = [p["backendRefs"] for p in extension["spec"]["extProc"]]
    picker_service = _one(base, "Service", picker["name"])
    assert picker["port"] in [p["port"] for p in picker_service["spec"]["ports"]]
    assert extension["spec"]["extProc"][0]["processingMode"]["request"]["body"] == "Buffered"
    patches = _one(objects, "EnvoyPatchPolicy", "pointsman-original-dst")["spec"]["jsonPatches"]
    namespace = "pointsman"
    names = {p["name"] for p in patches}
    assert f"{namespace}/{gateway['metadata']['name']}/{listener['name']}" in names
    assert f"envoyextensionpolicy/{namespace}/{extension['metadata']['name']}/extproc/0" in names
    (cluster,) = [p["operation"]["value"] for p in patches if p["name"] == "original_destination_cluster"]
    assert cluster["type"] == "ORIGINAL_DST"
    assert (
        cluster["original_dst_lb_config"]["http_header_name"]
        == _pointsman_config(base).picker.destination_header
    )


def test_the_grafana_dashboards_ship_as_a_config_map() -> None:
    config_map = _one(_objects("base"), "ConfigMap", "pointsman-grafana-dashboards")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = set(config_map["data"])
    assert shipped == {p.name for p in (REPO / "deploy/grafana/dashboards").glob("*.json")}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_meets_the_restricted_pod_security_standard(overlay: str) -> None:
    # The namespace enforces `restricted`: a pod that misses one of these is refused at admission.
    assert (
        _one(_objects("base"), "Namespace", "pointsman")["metadata"]["labels"][
            "pod-security.kubernetes.io/enforce"
        ]
        == "restricted"
    )
    for workload in _objects(f"overlays/{overlay}"):
        if workload["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, container["name"]
            assert context["capabilities"]["drop"] == ["ALL"], container["name"]


def test_probes_and_ports_are_where_the_config_listens() -> None:
    objects = _objects("base")
    config = _pointsman_config(objects)
    picker_pod = _one(objects, "Deployment", "pointsman-picker")["spec"]["template"]["spec"]
    (picker,) = [c for c in picker_pod["containers"] if c["name"] == "picker"]
    health_port = int(config.picker.health_listen.rsplit(":", 1)[1])
    assert picker["readinessProbe"]["grpc"]["port"] == health_port
    assert picker["livenessProbe"]["grpc"]["port"] == health_port
    ports = {p["name"]: p["containerPort"] for p in picker["ports"]}
    assert ports["metrics"] == int(config.picker.metrics_listen.rsplit(":", 1)[1])
    (collector,) = _one(objects, "Deployment", "pointsman-collector")["spec"]["template"]["spec"][
        "containers"
    ]
    assert collector["ports"][0]["containerPort"] == int(config.collector.listen.rsplit(":", 1)[1])
    assert collector["args"] == ["--config", "/etc/pointsman/pointsman.yaml"]
    mounts = {m["name"]: m["mountPath"] for m in collector["volumeMounts"]}
    assert mounts["config"] == "/etc/pointsman"


def test_the_cluster_serves_the_models_of_the_local_config() -> None:
    local = load_config(REPO / "config/local.yaml", environ={})
    for target in ("base", *[f"overlays/{o}" for o in POOL_OVERLAYS]):
        assert _pointsman_config(_objects(target)).models == local.models, target


CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "GatewayClass",
    "ClusterRole",
    "ClusterRoleBinding",
}


@pytest.mark.parametrize("target", ["base", *[f"overlays/{o}" for o in OVERLAYS]])
def test_namespaced_objects_are_in_pointsman_and_cluster_scoped_ones_in_none(target: str) -> None:
    for obj in _objects(target):
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] in CLUSTER_SCOPED:
            assert namespace is None, f"{obj['kind']}/{obj['metadata']['name']}"
        else:
            assert namespace == "pointsman", f"{obj['kind']}/{obj['metadata']['name']}"
