"""deploy/k8s: every overlay builds with `kubectl kustomize`, every object validates against the Kubernetes
schemas (kubernetes-validate, offline), the upstream GIE CRDs' schemas of each release it is meant for
(tests/deploy/data/gie-crds) or Envoy Gateway's pinned release's (tests/deploy/data/eg-crds), and the
pieces agree with each other: the Pointsman config parses and discovers the InferencePool whose selector
matches the overlay's pods, the collector's Role and the NetworkPolicies allow what its discovery does, the
InferenceObjectives and InferenceModelRewrites (v1) or InferenceModels (v1alpha2) are the config's models,
the gateway objects point at the picker Service and the pool, and Envoy Gateway's get the response's usage
to the picker as the standalone bootstraps do."""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import copy
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate
import lupa.lua51
import pytest
import yaml
from deploy_kit import (
    EG_LUA_VALIDATOR,
    GIE_RELEASES,
    REPO,
    crd_problems,
    eg_problems,
    file_tree,
    gie_crd_schemas,
    is_eg_kind,
    is_gie_kind,
    makefile_copies,
)

from pointsman_collector.kubernetes import KubeAccess, KubernetesTargets
from pointsman_collector.kubernetes.cluster_objects import PoolRef
from pointsman_collector.kubernetes.cluster_watch import ClusterObjectsWatch
from pointsman_devstack.envoy import ACCESS_LOG_NAME, ROUTE_NAMESPACE, usage_lua
from pointsman_devstack.stack import served_models
from pointsman_picker.accesslog import ACCESS_LOG_PATH
from pointsman_picker.extproc.servicer import PROCESS_PATH
from pointsman_picker.health import LIVENESS, READINESS_SERVICES
from pointsman_shared import upstream
from pointsman_shared.backoff import Backoff
from pointsman_shared.config import (
    INFERENCE_POOL_V1,
    INFERENCE_POOL_V1ALPHA2,
    PointsmanConfig,
    load_config,
    parse_config,
)

K8S = REPO / "deploy/k8s"
# Pool overlays (the base, a pool, its model servers); then what is applied after one.
POOL_OVERLAYS = ("sim", "vllm", "v1alpha2")
GATEWAY_OVERLAYS = ("standalone-envoy", "envoy-gateway", "envoy-gateway-v1alpha2")
OVERLAYS = (*POOL_OVERLAYS, *GATEWAY_OVERLAYS, "inference-objectives", "model-rewrites")
# vLLM pods on a v1alpha2 pool: what docs/deploy.md tells a user to write, built in a temporary directory.
VLLM_V1ALPHA2 = "vllm+components/v1alpha2"
TARGETS = ("base", *[f"overlays/{o}" for o in OVERLAYS], VLLM_V1ALPHA2)
KUBERNETES_VERSION = "1.33"
# Kinds from other projects' CRDs: checked here by what refers to what, not by schema. Envoy Gateway's
# are checked against its pinned release's CRDs (tests/deploy/data/eg-crds).
THIRD_PARTY = {
    "monitoring.coreos.com/v1": {"ServiceMonitor", "PodMonitor"},
    "gateway.networking.k8s.io/v1": {"GatewayClass", "Gateway", "HTTPRoute"},
}
# The GIE releases whose CRDs each target is meant for: with these installed, every GIE object in it is
# served and valid; with any other release's, one is not (test_the_gie_release_matrix checks both).
V1_RELEASES = ("v1.0.2", "v1.3.1", "v1.5.0", "v1.6.0")
SUPPORTED_RELEASES = {
    "base": V1_RELEASES,
    "overlays/sim": V1_RELEASES,
    "overlays/vllm": V1_RELEASES,
    # InferenceObjective: v1.0-v1.5 (v1.6 moved it out, with upstream's picker).
    "overlays/inference-objectives": ("v1.0.2", "v1.3.1", "v1.5.0"),
    # InferenceModelRewrite: v1.3-v1.5 (v1.0 had none yet; v1.6 moved it out, with upstream's picker).
    "overlays/model-rewrites": ("v1.3.1", "v1.5.0"),
    # InferenceModel: v0.x only (v1.0-v1.3 still serve the v1alpha2 pool, not the InferenceModel).
    "overlays/v1alpha2": ("v0.5.1",),
    VLLM_V1ALPHA2: ("v0.5.1",),
}
Objects = list[dict[str, Any]]


@functools.cache
def _build(target: str) -> tuple[dict[str, Any], ...]:
    kubectl = Path(sys.executable).parent / "kubectl"
    if target == VLLM_V1ALPHA2:
        return _build_kustomization(
            {"resources": ["overlays/vllm"], "components": ["components/v1alpha2"]}, kubectl
        )
    result = subprocess.run(
        [str(kubectl), "kustomize", str(K8S / target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def _build_kustomization(spec: dict[str, list[str]], kubectl: Path) -> tuple[dict[str, Any], ...]:
    """A kustomization of deploy/k8s paths in the pointsman namespace, as a user's own directory outside
    the repository would be (docs/deploy.md)."""
    with tempfile.TemporaryDirectory() as tmp:
        here = Path(tmp)
        relative = {key: [os.path.relpath(K8S / path, here) for path in paths] for key, paths in spec.items()}
        doc = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "namespace": "pointsman",
            **relative,
        }
        (here / "kustomization.yaml").write_text(yaml.safe_dump(doc))
        result = subprocess.run(
            [str(kubectl), "kustomize", tmp], capture_output=True, text=True, timeout=120, check=False
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


def _config_doc(objects: Objects) -> dict[str, Any]:
    (config_map,) = [
        o for o in _find(objects, "ConfigMap") if o["metadata"]["name"].startswith("pointsman-config")
    ]
    doc: dict[str, Any] = yaml.safe_load(config_map["data"]["pointsman.yaml"])
    return doc


def _pointsman_config(objects: Objects) -> PointsmanConfig:
    return parse_config(_config_doc(objects), source="pointsman-config")


def _pool_selector(pool: dict[str, Any]) -> dict[str, str]:
    """The pool's labels, as its API version writes them."""
    if pool["apiVersion"] == INFERENCE_POOL_V1:
        labels: dict[str, str] = pool["spec"]["selector"]["matchLabels"]
        return labels
    assert pool["apiVersion"] == INFERENCE_POOL_V1ALPHA2
    return dict(pool["spec"]["selector"])


def _pool_ports(pool: dict[str, Any]) -> list[int]:
    if pool["apiVersion"] == INFERENCE_POOL_V1:
        return [p["number"] for p in pool["spec"]["targetPorts"]]
    return [pool["spec"]["targetPortNumber"]]


def _picker_ref(pool: dict[str, Any]) -> tuple[str, int, str]:
    """(Service name, port, failure mode) of the pool's picker: endpointPickerRef (v1), extensionRef."""
    if pool["apiVersion"] == INFERENCE_POOL_V1:
        ref = pool["spec"]["endpointPickerRef"]
        return ref["name"], ref["port"]["number"], ref["failureMode"]
    ref = pool["spec"]["extensionRef"]
    return ref["name"], ref["portNumber"], ref["failureMode"]


def _gie_problems(objects: Objects, release: str) -> list[str]:
    """Why some GIE object of ``objects`` would not apply with the release's CRDs installed."""
    return crd_problems(objects, gie_crd_schemas(release), is_gie_kind)


@pytest.mark.parametrize("target", TARGETS)
def test_builds_and_every_object_validates(target: str) -> None:
    objects = _objects(target)
    for obj in objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if is_gie_kind(obj) or is_eg_kind(obj):
            continue  # against each GIE release's CRDs and Envoy Gateway's, below
        if obj["kind"] in THIRD_PARTY.get(obj["apiVersion"], ()):
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{target}: {where}: {exc.message} at {list(exc.path)}")
    for release in SUPPORTED_RELEASES.get(target, ()):
        assert _gie_problems(objects, release) == [], release
    assert eg_problems(objects) == []


@pytest.mark.parametrize("target", [t for t in TARGETS if t not in SUPPORTED_RELEASES])
def test_the_targets_without_a_gie_release_have_no_gie_objects(target: str) -> None:
    # The gateway overlays: they refer to the pool, whose kind is checked with the pool overlay.
    assert not [o for o in _objects(target) if is_gie_kind(o)]


def test_the_gie_release_matrix() -> None:
    """Each target applies with exactly the GIE releases it is meant for (SUPPORTED_RELEASES, the table
    in docs/deploy.md): with any other release's CRDs, some kind is not served or some object is refused."""
    matrix = {
        target: tuple(r for r in GIE_RELEASES if not _gie_problems(_objects(target), r))
        for target in SUPPORTED_RELEASES
    }
    assert matrix == SUPPORTED_RELEASES


@pytest.mark.parametrize("target", TARGETS)
def test_no_target_ships_a_custom_resource_definition(target: str) -> None:
    # Upstream owns the InferencePool, InferenceObjective and InferenceModel CRDs: shipping a copy would
    # overwrite the cluster's (docs/deploy.md names the release to install).
    assert not _find(_objects(target), "CustomResourceDefinition")


def test_no_file_under_deploy_k8s_is_a_custom_resource_definition() -> None:
    shipped = [
        p for p in K8S.rglob("*.yaml") if re.search(r"^kind:\s*CustomResourceDefinition", p.read_text(), re.M)
    ]
    assert shipped == []


def test_the_validator_rejects_a_misspelt_field() -> None:
    deployment = dict(_one(_objects("base"), "Deployment", "pointsman-picker"))
    deployment["spec"] = {**deployment["spec"], "replica": 3}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def _with(obj: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """``obj`` with these ``spec`` fields replaced (``None``: removed)."""
    new = {**obj["spec"], **spec}
    return {**obj, "spec": {k: v for k, v in new.items() if v is not None}}


def _bad_objects() -> list[tuple[str, dict[str, Any], str, str]]:
    pool = _one(_objects("base"), "InferencePool", "pointsman-pool")
    ref = pool["spec"]["endpointPickerRef"]
    objective = _one(_objects("overlays/inference-objectives"), "InferenceObjective", "sql-lora")
    model = _one(_objects("overlays/v1alpha2"), "InferenceModel", "tweet-summary")
    rewrite = _one(_objects("overlays/model-rewrites"), "InferenceModelRewrite", "tweet-summary")
    (rule,) = rewrite["spec"]["rules"]
    weights = model["spec"]["targetModels"]
    return [
        # (why, object, a release whose CRDs refuse it, what the refusal says)
        ("v1alpha2 port in v1", _with(pool, targetPortNumber=8000), "v1.5.0", "unknown field"),
        (
            "two ports in v1.0",
            _with(pool, targetPorts=[{"number": 8000}, {"number": 8001}]),
            "v1.0.2",
            "long",
        ),
        ("a port twice", _with(pool, targetPorts=[{"number": 8000}] * 2), "v1.3.1", "unique"),
        (
            "no picker port",
            _with(pool, endpointPickerRef={"name": ref["name"]}),
            "v1.6.0",
            "port is required",
        ),
        ("bad failure mode", _with(pool, endpointPickerRef={**ref, "failureMode": "Open"}), "v1.0.2", "Open"),
        ("no selector", _with(pool, selector=None), "v1.0.2", "'selector' is a required property"),
        ("priority as a word", _with(objective, priority="high"), "v1.3.1", "'high' is not of type"),
        ("no pool", _with(objective, poolRef=None), "v1.5.0", "'poolRef' is a required property"),
        ("bad criticality", _with(model, criticality="Important"), "v0.5.1", "Important"),
        ("some weights", _with(model, targetModels=[weights[0], {"name": "x"}]), "v0.5.1", "Weights"),
        ("no target", _with(rewrite, rules=[{**rule, "targets": []}]), "v1.3.1", "non-empty"),
        (
            "weight zero",
            _with(rewrite, rules=[{**rule, "targets": [{"modelRewrite": "x", "weight": 0}]}]),
            "v1.5.0",
            "less than the minimum of 1",
        ),
        (
            "a target model's name",
            _with(rewrite, rules=[{**rule, "targets": [{"name": "x", "weight": 1}]}]),
            "v1.3.1",
            "'modelRewrite' is a required property",
        ),
        (
            "a prefix match",
            _with(rewrite, rules=[{**rule, "matches": [{"model": {"type": "Prefix", "value": "t"}}]}]),
            "v1.5.0",
            "Prefix",
        ),
    ]


def test_the_crd_schemas_refuse_what_the_api_server_would() -> None:
    accepted = []
    for why, obj, release, message in _bad_objects():
        problems = _gie_problems([obj], release)
        if not any(message in p for p in problems):
            accepted.append((why, release, problems))
    assert accepted == []


def _changed(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``obj`` with the field at the dotted ``path`` (list items by index) set to ``value``
    (``None``: removed)."""
    new = copy.deepcopy(obj)
    *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]
    node = new
    for key in parents:
        node = node[key]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return new


def _bad_envoy_gateway_objects() -> list[tuple[str, dict[str, Any], str]]:
    objects = _objects("overlays/envoy-gateway")
    extension = _one(objects, "EnvoyExtensionPolicy", "pointsman-ext-proc")
    proxy = _one(objects, "EnvoyProxy", "pointsman-proxy")
    patch = _one(objects, "EnvoyPatchPolicy", "pointsman-original-dst")
    traffic = _one(objects, "BackendTrafficPolicy", "pointsman-pool")
    sink = "spec.telemetry.accessLog.settings.0.sinks.0"
    return [
        # (why, object, what the refusal says)
        (
            "a body mode misspelt",
            _changed(extension, "spec.extProc.0.processingMode.response.body", "Stream"),
            "Stream",
        ),
        (
            "the namespace field of older releases",
            _changed(
                extension, "spec.extProc.0.metadataOptions", {"receivingNamespaces": {"untyped": ["x"]}}
            ),
            "unknown field 'metadataOptions'",
        ),
        (
            "an Envoy filter's namespace",
            _changed(
                extension, "spec.extProc.0.metadata.writableNamespaces", ["envoy.filters.http.ext_proc"]
            ),
            "cannot contain well-known Envoy HTTP filter namespaces",
        ),
        (
            "full duplex failing open",
            _changed(
                _changed(extension, "spec.extProc.0.failOpen", True),
                "spec.extProc.0.processingMode.request.body",
                "FullDuplexStreamed",
            ),
            "FailOpen must be false",
        ),
        (
            "Lua inline and by reference",
            _changed(extension, "spec.lua.0.inline", "x"),
            "Exactly one of inline",
        ),
        ("Lua from a Secret", _changed(extension, "spec.lua.0.valueRef.kind", "Secret"), "kind ConfigMap"),
        (
            "an ALS sink without its settings",
            _changed(proxy, f"{sink}.als", None),
            "als field needs to be set",
        ),
        (
            "an ALS sink with no backend",
            _changed(proxy, f"{sink}.als.backendRefs", []),
            "at least one backend",
        ),
        (
            "a picker without a port",
            _changed(proxy, f"{sink}.als.backendRefs.0.port", None),
            "Must have port",
        ),
        (
            "access logs misspelt",
            _changed(proxy, "spec.telemetry.accessLogs", {}),
            "unknown field 'accessLogs'",
        ),
        ("a merge type misspelt", _changed(proxy, "spec.mergeType", "Merge"), "Merge"),
        ("a patch type misspelt", _changed(patch, "spec.type", "JSONPatches"), "JSONPatches"),
        (
            "a policy on a Service",
            _changed(traffic, "spec.targetRefs.0.kind", "Service"),
            "this policy can only have a targetRefs[*].kind",
        ),
    ]


def test_envoy_gateway_s_crd_schemas_refuse_what_the_api_server_would() -> None:
    accepted = []
    for why, obj, message in _bad_envoy_gateway_objects():
        problems = eg_problems([obj])
        if not any(message in p for p in problems):
            accepted.append((why, problems))
    assert accepted == []


@pytest.mark.parametrize(
    ("name", "releases"),
    [
        ("inferencepool-v1", ("v1.3.1", "v1.5.0", "v1.6.0")),
        ("inferencepool-v1alpha2", ("v0.5.1", "v1.0.2", "v1.3.1")),
    ],
)
def test_the_collector_tests_record_pools_as_the_api_server_returns_them(
    name: str, releases: tuple[str, ...]
) -> None:
    # The recorded GET responses the collector's discovery tests run on are valid objects of these
    # releases (a v1 pool with two target ports: v1.1 and later; v1.0 allows one).
    recorded = json.loads((REPO / f"services/collector/tests/data/kubernetes/{name}.json").read_text())
    valid = tuple(r for r in GIE_RELEASES if not _gie_problems([recorded], r))
    assert valid == releases


POOL_TARGETS = ("base", *[f"overlays/{o}" for o in POOL_OVERLAYS], VLLM_V1ALPHA2)
V1_POOL_TARGETS = ("base", "overlays/sim", "overlays/vllm")
V1ALPHA2_POOL_TARGETS = ("overlays/v1alpha2", VLLM_V1ALPHA2)


@pytest.mark.parametrize("target", POOL_TARGETS)
def test_the_pool_serves_the_config_s_port_and_names_the_picker(target: str) -> None:
    objects = _objects(target)
    config = _pointsman_config(objects)
    pool = _one(objects, "InferencePool", config.pool.name)
    assert config.pool.target_port in _pool_ports(pool)
    name, port, failure_mode = _picker_ref(pool)
    service = _one(objects, "Service", name)
    assert port in [p["port"] for p in service["spec"]["ports"]]
    assert failure_mode == config.pool.failure_mode.value


def _object_name(model_name: str) -> str:
    """The Kubernetes name the manifests give a model's object: its last path part, lower case, each run
    of other characters than letters and digits a dash (meta-llama/Llama-3.1-8B-Instruct:
    llama-3-1-8b-instruct)."""
    return re.sub(r"[^a-z0-9]+", "-", model_name.rsplit("/", 1)[-1].lower()).strip("-")


def test_the_inference_objectives_are_the_config_s_models() -> None:
    config = _pointsman_config(_objects("base"))
    objectives = _objects("overlays/inference-objectives")
    declared = {o["metadata"]["name"]: o["spec"].get("priority", 0) for o in objectives}
    # The picker reads the objectives from its config: the same names and priorities ...
    assert declared == {o.name: o.priority for o in config.objectives}
    # ... one per model, as sheddable as the model is.
    assert {_object_name(m.model_name): m.critical for m in config.models} == {
        name: priority >= 0 for name, priority in declared.items()
    }
    pools = {(o["spec"]["poolRef"].get("group"), o["spec"]["poolRef"]["name"]) for o in objectives}
    assert pools == {("inference.networking.k8s.io", config.pool.name)}
    assert {o["kind"] for o in objectives} == {"InferenceObjective"}


def test_the_inference_model_rewrites_are_the_config_s_models_rewrites() -> None:
    # The picker reads the rewrites from its config; the overlay mirrors them for the cluster's other
    # GIE-aware consumers: one object per model with targetModels, one rule matching exactly its name.
    config = _pointsman_config(_objects("base"))
    rewrites = _objects("overlays/model-rewrites")
    assert {o["kind"] for o in rewrites} == {"InferenceModelRewrite"}
    declared = {}
    for rewrite in rewrites:
        ((match,),) = [rule["matches"] for rule in rewrite["spec"]["rules"]]
        assert match["model"].get("type", "Exact") == "Exact"
        (rule,) = rewrite["spec"]["rules"]
        declared[match["model"]["value"]] = (rewrite["metadata"]["name"], rule["targets"])
    assert declared == {
        m.model_name: (
            _object_name(m.model_name),
            [
                {"modelRewrite": t.name, **({"weight": t.weight} if t.weight is not None else {})}
                for t in m.target_models
            ],
        )
        for m in config.models
        if m.target_models
    }
    pools = {(o["spec"]["poolRef"].get("group"), o["spec"]["poolRef"]["name"]) for o in rewrites}
    assert pools == {("inference.networking.k8s.io", config.pool.name)}


@pytest.mark.parametrize("target", V1ALPHA2_POOL_TARGETS)
def test_the_v1alpha2_inference_models_are_the_config_s_models(target: str) -> None:
    objects = _objects(target)
    config = _pointsman_config(objects)
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
    assert {m["metadata"]["name"] for m in _find(objects, "InferenceModel")} == {
        _object_name(m.model_name) for m in config.models
    }


@pytest.mark.parametrize("target", V1_POOL_TARGETS)
def test_the_v1_path_has_no_inference_models(target: str) -> None:
    # GIE v1.0+ has no InferenceModel kind: one would fail the whole apply ("no matches for kind").
    assert not _find(_objects(target), "InferenceModel")


def test_the_v1alpha2_config_is_the_base_s_but_for_the_api_version() -> None:
    base = _config_doc(_objects("base"))
    v1alpha2 = _config_doc(_objects("overlays/v1alpha2"))
    assert base["pool"]["kubernetes"]["apiVersion"] == INFERENCE_POOL_V1
    assert v1alpha2["pool"]["kubernetes"]["apiVersion"] == INFERENCE_POOL_V1ALPHA2
    base["pool"]["kubernetes"]["apiVersion"] = INFERENCE_POOL_V1ALPHA2
    assert v1alpha2 == base


@pytest.mark.parametrize("target", POOL_TARGETS)
def test_the_collectors_discover_the_inference_pool_and_share_it(target: str) -> None:
    objects = _objects(target)
    config = _pointsman_config(objects)
    discovery = config.pool.kubernetes
    assert discovery is not None
    # No address in the config: the pods come and go with the cluster.
    assert (config.pool.endpoints, config.pool.endpoints_file) == ((), None)
    (pool,) = _find(objects, "InferencePool")
    assert pool["metadata"]["name"] == (discovery.inference_pool or config.pool.name)
    assert pool["apiVersion"] == discovery.api_version
    # The service account's namespace, where the Role lets it look and where the pool is.
    assert discovery.namespace in (None, pool["metadata"]["namespace"])
    assert config.collector.sharing is True
    assert _one(objects, "Deployment", "pointsman-collector")["spec"]["replicas"] >= 2


@pytest.mark.parametrize("target", [t for t in POOL_TARGETS if t != "base"])
def test_the_pool_selects_the_overlay_s_model_servers_on_their_port(target: str) -> None:
    objects = _objects(target)
    pool = _one(objects, "InferencePool", _pointsman_config(objects).pool.name)
    # A Deployment: the pool follows its pods wherever they are, no per-pod Service or fixed address.
    template = _one(objects, "Deployment", "model-server")["spec"]["template"]
    assert _pool_selector(pool).items() <= template["metadata"]["labels"].items()
    ports = [p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])]
    assert set(_pool_ports(pool)) <= set(ports)
    assert not [s for s in _find(objects, "Service") if s["metadata"]["name"].startswith("model-server")]


Permission = tuple[str, str, str, str]  # namespace, API group, resource, verb


def _role_permissions(role: dict[str, Any]) -> set[Permission]:
    return {
        (role["metadata"]["namespace"], group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


class RecordingApi:
    """Just enough of the Kubernetes API for the collector's discovery to run against: the rendered
    InferencePool at its own group and version (any other is a 404, as on a cluster whose CRDs do not
    serve it), no pods, the ``cluster`` objects (InferenceObjectives, InferenceModelRewrites by group,
    version and resource; their status patched in place), watches that end at once. Each request is
    checked against the Role as the API server's RBAC would (403 when no rule grants its namespace,
    group, resource and verb) and recorded as the permission it needs."""

    def __init__(
        self,
        pool: dict[str, Any],
        allowed: set[Permission],
        *,
        enough: int,
        cluster: dict[tuple[str, str], list[dict[str, Any]]] | None = None,
    ) -> None:
        self._pool = {**pool, "metadata": {**pool["metadata"], "resourceVersion": "1"}}
        self._allowed = allowed
        self._cluster = cluster or {}
        self.requests: list[Permission] = []
        self.forbidden: list[Permission] = []
        self.patches: list[tuple[str, dict[str, Any]]] = []  # path, body
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
        try:
            request_line = (await reader.readline()).decode()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            sent = await reader.readexactly(length) if length else b""
        except (ConnectionError, asyncio.IncompleteReadError):
            sent = request_line = b"".decode()
        if not request_line:  # a connection the client closed unused (its task was cancelled)
            writer.close()
            return
        method, target, _version = request_line.split(" ")
        url = urlsplit(target)
        watch = parse_qs(url.query).get("watch") == ["1"]
        # /api/v1/namespaces/NS/RESOURCE[/NAME[/SUBRESOURCE]] or /apis/GROUP/VERSION/namespaces/NS/...
        parts = url.path.strip("/").split("/")
        group_version, rest = ("v1", parts[2:]) if parts[0] == "api" else ("/".join(parts[1:3]), parts[3:])
        group = "" if parts[0] == "api" else parts[1]
        _namespaces, namespace, resource, *name = rest
        if len(name) == 2:  # a subresource: RBAC names it resource/subresource
            resource, name = f"{resource}/{name[1]}", name[:1]
        verb = "patch" if method == "PATCH" else "get" if name else "watch" if watch else "list"
        permission = (namespace, group, resource, verb)
        self.requests.append(permission)
        if len(self.requests) >= self._enough:
            self.seen_enough.set()
        status = b"200 OK"
        listed = self._cluster.get((group_version, resource.split("/")[0]))
        if permission not in self._allowed:
            self.forbidden.append(permission)
            status, body = b"403 Forbidden", json.dumps({"kind": "Status", "code": 403}).encode()
        elif resource == "inferencepools" and group_version != self._pool["apiVersion"]:
            status, body = b"404 Not Found", json.dumps({"kind": "Status", "code": 404}).encode()
        elif watch:
            await asyncio.sleep(0.05)  # an empty watch the server ended: the client watches again
            body = b""
        elif resource == "inferencepools":
            body = json.dumps(self._pool).encode()
        elif verb == "patch" and listed is not None:
            (obj,) = [o for o in listed if o["metadata"]["name"] == name[0]]
            obj["status"] = json.loads(sent)["status"]
            self.patches.append((url.path, json.loads(sent)))
            body = json.dumps(obj).encode()
        else:
            items = listed if listed is not None else []
            body = json.dumps({"items": items, "metadata": {"resourceVersion": "1"}}).encode()
        with contextlib.suppress(ConnectionError):  # the client may have gone meanwhile
            writer.write(
                b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (status, len(body), body)
            )
            await writer.drain()
        writer.close()


async def _discover(
    objects: Objects, role: dict[str, Any], api_version: str, *, enough: int
) -> tuple[RecordingApi, KubernetesTargets]:
    """Run the collector's discovery of the overlay's pool with ``api_version``, as ``role`` allows."""
    config = _pointsman_config(objects)
    discovery = config.pool.kubernetes
    assert discovery is not None
    pool_name = discovery.inference_pool or config.pool.name
    return await discover_pool(
        _one(objects, "InferencePool", pool_name),
        role,
        namespace=discovery.namespace or role["metadata"]["namespace"],
        api_version=api_version,
        enough=enough,
    )


async def discover_pool(
    pool: dict[str, Any], role: dict[str, Any], *, namespace: str, api_version: str, enough: int
) -> tuple[RecordingApi, KubernetesTargets]:
    """The real discovery of ``pool`` against an API that answers as ``role`` allows, until it has
    answered ``enough`` calls (the Helm chart's tests use it too)."""
    async with RecordingApi(pool, _role_permissions(role), enough=enough) as api:
        targets = KubernetesTargets(
            KubeAccess(server=api.url, namespace=namespace),
            pool=pool["metadata"]["name"],
            api_version=api_version,
            on_change=lambda _pods: None,
            backoff=Backoff(initial=0.01, maximum=0.05),
        )
        follow = asyncio.create_task(targets.run())
        try:
            async with asyncio.timeout(30):
                await api.seen_enough.wait()
        finally:
            follow.cancel()
            await asyncio.gather(follow, return_exceptions=True)
    return api, targets


# The calls the collector's watch of InferenceObjectives and InferenceModelRewrites makes: a list and a
# watch of each kind in each group, and a status patch of each object of the pool.
CLUSTER_GROUPS = ("inference.networking.x-k8s.io", "llm-d.ai")
CLUSTER_RESOURCES = ("inferenceobjectives", "inferencemodelrewrites")


def cluster_permissions(namespace: str, *, status: bool = True) -> set[Permission]:
    """What the Role must grant for the cluster objects, no more: list and watch, and patch of status."""
    watched = {
        (namespace, g, r, v) for g in CLUSTER_GROUPS for r in CLUSTER_RESOURCES for v in ("list", "watch")
    }
    patched = {(namespace, g, f"{r}/status", "patch") for g in CLUSTER_GROUPS for r in CLUSTER_RESOURCES}
    return watched | (patched if status else set())


def pool_objects(pool: str, group: str) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """One objective and one rewrite of ``pool`` in each group that serves them."""
    objects: dict[tuple[str, str], list[dict[str, Any]]] = {}
    ref = {"name": pool, "group": group}
    for group_version in ("inference.networking.x-k8s.io/v1alpha2", "llm-d.ai/v1alpha2"):
        suffix = group_version.split(".")[0].split("/")[0]
        objects[(group_version, "inferenceobjectives")] = [
            {
                "apiVersion": group_version,
                "kind": "InferenceObjective",
                "metadata": {"name": f"batch-{suffix}", "generation": 1, "resourceVersion": "1"},
                "spec": {"poolRef": ref, "priority": -1},
            }
        ]
        objects[(group_version, "inferencemodelrewrites")] = [
            {
                "apiVersion": group_version,
                "kind": "InferenceModelRewrite",
                "metadata": {
                    "name": f"canary-{suffix}",
                    "generation": 1,
                    "resourceVersion": "1",
                    "creationTimestamp": "2026-12-01T00:00:00Z",
                },
                "spec": {
                    "poolRef": ref,
                    "rules": [
                        {"matches": [{"model": {"value": "m"}}], "targets": [{"modelRewrite": "m-v2"}]}
                    ],
                },
            }
        ]
    return objects


async def watch_cluster_objects(
    pool: dict[str, Any], role: dict[str, Any], *, namespace: str, api_version: str, write_status: bool = True
) -> RecordingApi:
    """The collector's real watch of the pool's objectives and rewrites (one of each in each group)
    against an API that answers as ``role`` allows, until every kind of call has been made (the Helm
    chart's tests use it too)."""
    name, group = pool["metadata"]["name"], api_version.split("/")[0]
    cluster = pool_objects(name, group)
    # 4 lists, 4 patches, then the watches, each renewed.
    async with RecordingApi(pool, _role_permissions(role), enough=20, cluster=cluster) as api:
        watch = ClusterObjectsWatch(
            KubeAccess(server=api.url, namespace=namespace),
            pool=PoolRef(name, group),
            write_status=write_status,
            backoff=Backoff(initial=0.01, maximum=0.05),
        )
        task = asyncio.create_task(watch.run())
        try:
            async with asyncio.timeout(30):
                await api.seen_enough.wait()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return api


def _collector_role(objects: Objects) -> dict[str, Any]:
    collector = _one(objects, "Deployment", "pointsman-collector")
    namespace = collector["metadata"]["namespace"]
    pod = collector["spec"]["template"]["spec"]
    assert pod.get("automountServiceAccountToken", True) is True  # discovery runs on its token
    binding = _one(objects, "RoleBinding", "pointsman-collector")
    account = {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": namespace}
    assert account in binding["subjects"]
    role = _one(objects, "Role", binding["roleRef"]["name"])
    assert role["metadata"]["namespace"] == namespace
    return role


@pytest.mark.parametrize("target", POOL_TARGETS)
async def test_the_collector_s_role_allows_every_call_its_discovery_makes(target: str) -> None:
    # v1 discovery with the base's Role (sim, vllm); v1alpha2 discovery with the v1alpha2 component's.
    objects = _objects(target)
    discovery = _pointsman_config(objects).pool.kubernetes
    assert discovery is not None
    # The first list, then both watches, each renewed: by then every kind of call has been made.
    api, targets = await _discover(objects, _collector_role(objects), discovery.api_version, enough=12)
    assert api.forbidden == []
    assert targets.synced.is_set()
    group = discovery.api_version.split("/")[0]
    assert {(g, r) for _, g, r, _ in api.requests} == {("", "pods"), (group, "inferencepools")}
    assert {v for *_, v in api.requests} == {"get", "list", "watch"}


@pytest.mark.parametrize(
    ("target", "api_version"),
    [("overlays/sim", INFERENCE_POOL_V1ALPHA2), ("overlays/v1alpha2", INFERENCE_POOL_V1)],
)
async def test_discovery_of_the_other_version_is_forbidden_by_the_role(target: str, api_version: str) -> None:
    # The check above can fail: a Role without the configured version's group gets 403 and no pods.
    objects = _objects(target)
    api, targets = await _discover(objects, _collector_role(objects), api_version, enough=3)
    assert api.forbidden
    assert {r for _, _, r, _ in api.forbidden} == {"inferencepools"}
    assert not targets.synced.is_set()
    assert targets.endpoints == ()


@pytest.mark.parametrize("target", POOL_TARGETS)
async def test_the_collector_s_role_allows_every_call_its_cluster_object_watch_makes(target: str) -> None:
    objects = _objects(target)
    config = _pointsman_config(objects)
    discovery = config.pool.kubernetes
    assert discovery is not None
    role = _collector_role(objects)
    pool = _one(objects, "InferencePool", discovery.inference_pool or config.pool.name)
    namespace = role["metadata"]["namespace"]
    api = await watch_cluster_objects(pool, role, namespace=namespace, api_version=discovery.api_version)
    assert api.forbidden == []
    # Every object got its Accepted condition, and the Role grants exactly the calls made.
    assert len(api.patches) == 4
    assert all(b["status"]["conditions"][0]["status"] == "True" for _, b in api.patches)
    used = {p for p in api.requests if p[2].split("/")[0] in CLUSTER_RESOURCES}
    assert used == cluster_permissions(namespace)
    granted = {p for p in _role_permissions(role) if p[2].split("/")[0] in CLUSTER_RESOURCES}
    assert granted == used


async def test_a_role_without_status_patch_still_watches_and_writes_no_status() -> None:
    # The watch's calls are checked by RBAC: the Role without patch gets 403 there, and goes on.
    objects = _objects("overlays/sim")
    role = copy.deepcopy(_collector_role(objects))
    role["rules"] = [r for r in role["rules"] if "patch" not in r["verbs"]]
    pool = _one(objects, "InferencePool", _pointsman_config(objects).pool.name)
    namespace = role["metadata"]["namespace"]
    api = await watch_cluster_objects(pool, role, namespace=namespace, api_version=pool["apiVersion"])
    assert {p[3] for p in api.forbidden} == {"patch"}
    assert api.patches == []
    # One 403 per kind and group turns status writing off there: not one per change.
    assert len(api.forbidden) == 4
    assert {"list", "watch"} <= {p[3] for p in api.requests if p not in api.forbidden}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert "matchExpressions" not in selector  # none here; this check reads matchLabels only
    match_labels: dict[str, str] = selector.get("matchLabels", {})
    return match_labels.items() <= labels.items()


def _policies_allow(
    objects: Objects,
    direction: str,
    pod: dict[str, str],
    peer: dict[str, str] | None,
    port: int,
    *,
    namespace: str | None = None,
) -> bool:
    """Whether the NetworkPolicies let ``pod`` (its labels) receive (``ingress``) from or send
    (``egress``) to ``peer`` (a pod's labels, in ``namespace``: by default the policy's own; ``None``: an
    address outside the cluster, e.g. the API server) on TCP ``port``. No policy of that direction
    selecting ``pod``: allowed. A namespace's labels are its name's (``kubernetes.io/metadata.name``)."""
    policies = [
        p
        for p in _find(objects, "NetworkPolicy")
        if direction.capitalize() in p["spec"].get("policyTypes", ["Ingress"])
        and _selects(p["spec"]["podSelector"], pod)
    ]
    for policy in policies:
        own = policy["metadata"].get("namespace", "pointsman")
        peer_namespace = {"kubernetes.io/metadata.name": namespace or own}
        for rule in policy["spec"].get(direction, []):
            if rule.get("ports") and port not in [p.get("port") for p in rule["ports"]]:
                continue
            peers = rule.get("from" if direction == "ingress" else "to")
            if not peers:
                return True
            for candidate in peers:
                if peer is None:
                    if "ipBlock" in candidate:
                        return True
                    continue
                if "namespaceSelector" in candidate:
                    in_namespace = _selects(candidate["namespaceSelector"], peer_namespace)
                else:
                    in_namespace = namespace in (None, own)
                selected = "podSelector" not in candidate or _selects(candidate["podSelector"], peer)
                if "ipBlock" not in candidate and in_namespace and selected:
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


_ANY_NAMESPACE = {"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": _OTHER}}]}
_MONITORING = {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}]}


@pytest.mark.parametrize(
    ("rule", "peer", "namespace", "allowed"),
    [
        (_FROM_OTHER, _OTHER, None, True),
        (_FROM_OTHER, _OTHER, "elsewhere", False),  # a bare podSelector: the policy's namespace only
        (_ANY_NAMESPACE, _OTHER, "elsewhere", True),
        (_ANY_NAMESPACE, {"app": "c"}, "elsewhere", False),
        (_MONITORING, {"app": "c"}, "mon", True),  # every pod of the namespace
        (_MONITORING, _OTHER, None, False),
    ],
)
def test_the_network_policy_reading_of_namespaces(
    rule: dict[str, Any], peer: dict[str, str], namespace: str | None, allowed: bool
) -> None:
    policies = [_policy("ingress", rule)]
    assert _policies_allow(policies, "ingress", _POD, peer, 80, namespace=namespace) is allowed


# Each pool target with the gateway overlays that go with it.
_GATEWAYS = {
    "overlays/sim": ("standalone-envoy", "envoy-gateway"),
    "overlays/vllm": ("standalone-envoy", "envoy-gateway"),
    "overlays/v1alpha2": ("standalone-envoy", "envoy-gateway-v1alpha2"),
    VLLM_V1ALPHA2: ("standalone-envoy", "envoy-gateway-v1alpha2"),
}


@pytest.mark.parametrize("target", list(_GATEWAYS))
def test_network_policies_let_the_collectors_reach_the_api_the_pods_and_redis(target: str) -> None:
    # Everything one namespace gets: a pool overlay and the gateway overlays.
    objects = _objects(target)
    for gateway in _GATEWAYS[target]:
        objects += _objects(f"overlays/{gateway}")
    pool = _one(objects, "InferencePool", _pointsman_config(objects).pool.name)
    collector = _one(objects, "Deployment", "pointsman-collector")["spec"]["template"]["metadata"]["labels"]
    model_server = _one(objects, "Deployment", "model-server")["spec"]["template"]["metadata"]["labels"]
    redis = _one(objects, "StatefulSet", "pointsman-redis")["spec"]["template"]["metadata"]["labels"]
    for port in _pool_ports(pool):
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
    assert _picker_ref(pool)[:2] == ("pointsman-picker", extproc["port"])
    picker = _one(objects, "Deployment", "pointsman-picker")["spec"]["template"]["metadata"]["labels"]
    gateway = {"pointsman.dev/gateway": "true"}
    assert _policies_allow(objects, "ingress", picker, gateway, tls_port, namespace="gateways")
    assert not _policies_allow(objects, "ingress", picker, {"app": "other"}, tls_port)
    loopback = int(config.picker.listen.rsplit(":", 1)[1])
    assert not _policies_allow(objects, "ingress", picker, gateway, loopback)


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


@pytest.mark.parametrize("target", POOL_TARGETS)
def test_the_collector_s_role_reads_pods_and_the_pools_of_the_configured_group(target: str) -> None:
    # No more than discovery needs: the v1 group in the base, the x-k8s group with components/v1alpha2.
    objects = _objects(target)
    discovery = _pointsman_config(objects).pool.kubernetes
    assert discovery is not None
    role = _one(objects, "Role", "pointsman-collector")
    namespace = role["metadata"]["namespace"]
    pools = {
        (namespace, g, r, v)
        for g, r in (("", "pods"), (discovery.api_version.split("/")[0], "inferencepools"))
        for v in ("get", "list", "watch")
    }
    assert _role_permissions(role) == pools | cluster_permissions(namespace)


def test_only_the_collector_and_pickers_reach_redis() -> None:
    policy = _one(_objects("base"), "NetworkPolicy", "pointsman-redis")
    (rule,) = policy["spec"]["ingress"]
    assert sorted(p["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for p in rule["from"]) == [
        "collector",
        "picker",
    ]


@pytest.mark.parametrize("target", ["base", "overlays/sim"])
def test_only_prometheus_reads_the_metrics_and_the_pool_and_anyone_the_health(target: str) -> None:
    # /metrics of both services and the collector's /v1/pool show every pod's address, load and adapters:
    # the scrapers only. The picker's gRPC health says SERVING or NOT_SERVING: open.
    objects = _objects(target)
    labels = {
        name: _one(objects, "Deployment", f"pointsman-{name}")["spec"]["template"]["metadata"]["labels"]
        for name in ("picker", "collector")
    }
    prometheus = {"app.kubernetes.io/name": "prometheus", "prometheus": "k8s"}
    others = [labels["picker"], labels["collector"], {"pointsman.dev/gateway": "true"}, {"app": "vllm"}]
    for pod, port in ((labels["picker"], 9090), (labels["collector"], 9100)):
        assert _policies_allow(objects, "ingress", pod, prometheus, port, namespace="monitoring")
        for other in others:
            assert not _policies_allow(objects, "ingress", pod, other, port), other
    for other in others:
        assert _policies_allow(objects, "ingress", labels["picker"], other, 9003)


def _acl_users(text: str) -> dict[str, list[str]]:
    """The rules of each user of a Redis ACL file, by name."""
    return {line.split()[1]: line.split()[2:] for line in text.splitlines() if line.startswith("user ")}


def test_redis_runs_the_shipped_acl_users_and_each_service_has_its_own() -> None:
    objects = _objects("base")
    secret = _one(objects, "Secret", "pointsman-redis")
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    shipped = (REPO / "deploy/redis/users.acl").read_text(encoding="utf-8")
    assert data["users.acl"] == shipped
    assert (K8S / "base/redis-users.acl").read_text(encoding="utf-8") == shipped
    users = _acl_users(shipped)
    assert users["default"][0] == "off"
    redis = _one(objects, "StatefulSet", "pointsman-redis")["spec"]["template"]["spec"]
    (container,) = redis["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in redis["volumes"]}
    acl_path = container["args"][container["args"].index("--aclfile") + 1]
    (mounted,) = [name for name, path in mounts.items() if acl_path.startswith(f"{path}/")]
    assert volumes[mounted]["secret"]["items"] == [{"key": "users.acl", "path": acl_path.rsplit("/", 1)[1]}]
    assert "--requirepass" not in container["args"]

    def password_of(user: str) -> str:
        (digest,) = [rule[1:] for rule in users[user] if rule.startswith("#")]
        return digest

    for service, user in (("collector", "pointsman-collector"), ("picker", "pointsman-picker")):
        pod = _one(objects, "Deployment", f"pointsman-{service}")["spec"]["template"]["spec"]
        (env,) = [e for c in pod["containers"] for e in c.get("env", []) if e["name"] == "REDIS_URL"]
        url = urlsplit(data[env["valueFrom"]["secretKeyRef"]["key"]])
        assert url.username == user
        assert url.password is not None
        assert hashlib.sha256(url.password.encode()).hexdigest() == password_of(user)
    # The probes log in as the picker, whose PING is all they send.
    (auth,) = [e for e in container["env"] if e["name"] == "REDISCLI_AUTH"]
    probe_password = data[auth["valueFrom"]["secretKeyRef"]["key"]]
    assert hashlib.sha256(probe_password.encode()).hexdigest() == password_of("pointsman-picker")
    for probe in (container["readinessProbe"], container["livenessProbe"]):
        command = probe["exec"]["command"]
        assert command[command.index("--user") + 1] == "pointsman-picker"
        assert command[-1] == "ping"
    assert "+ping" in users["pointsman-picker"]


def test_every_container_runs_non_root_with_a_read_only_root() -> None:
    # Not the vLLM pods: the vllm overlay leaves their root filesystem writable.
    for target in [t for t in TARGETS if "vllm" not in t]:
        for workload in _objects(target):
            if workload["kind"] not in ("Deployment", "StatefulSet"):
                continue
            pod = workload["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True
            for container in pod["containers"]:
                assert container["securityContext"]["readOnlyRootFilesystem"] is True, container["name"]


@pytest.mark.parametrize(
    ("overlay", "pool_target"),
    [("envoy-gateway", "overlays/sim"), ("envoy-gateway-v1alpha2", "overlays/v1alpha2")],
)
def test_envoy_gateway_objects_point_at_the_pool_and_the_picker(overlay: str, pool_target: str) -> None:
    objects = _objects(f"overlays/{overlay}")
    base = _objects(pool_target)
    gateway = _one(objects, "Gateway", "inference-gateway")
    (listener,) = gateway["spec"]["listeners"]
    route = _one(objects, "HTTPRoute", "llm-route")
    ((backend,),) = [rule["backendRefs"] for rule in route["spec"]["rules"]]
    pool = _one(base, "InferencePool", backend["name"])
    # The pool's group, as the gateway looks it up; no port, as upstream (the pool has its targetPorts).
    assert (backend["group"], backend["kind"]) == (pool["apiVersion"].split("/")[0], "InferencePool")
    assert "port" not in backend
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
    proxy = envoy_gateway_usage_path(objects, extension, tls=True)
    assert gateway["spec"]["infrastructure"]["parametersRef"] == {
        "group": "gateway.envoyproxy.io",
        "kind": "EnvoyProxy",
        "name": proxy["metadata"]["name"],
    }
    assert proxy["metadata"]["namespace"] == gateway["metadata"]["namespace"]


# Envoy Gateway names the access log's cluster accesslog_als_<setting>_<sink> by the ALS sink's place in
# the EnvoyProxy (v1.9.0: internal/gatewayapi/listener.go, Translator.processAccessLog).
ALS_CLUSTER = "accesslog_als_0_0"


def envoy_gateway_usage_path(objects: Objects, extension: dict[str, Any], *, tls: bool) -> dict[str, Any]:
    """Check that Envoy Gateway objects (the overlay's, the chart's) get the response's usage to the
    picker as the standalone bootstraps do: ext_proc sees the response headers only and lets the picker
    write pointsman.route, the Lua filter is deploy/envoy/usage.lua, and the EnvoyProxy's access log
    streams to the ext_proc backend (over TLS when that is); return the EnvoyProxy."""
    (ext_proc,) = extension["spec"]["extProc"]
    assert ext_proc["processingMode"]["response"] == {}  # headers sent, no body
    assert ext_proc["processingMode"].get("allowModeOverride") is not True
    assert ROUTE_NAMESPACE in ext_proc["metadata"]["writableNamespaces"]
    ((lua,),) = [extension["spec"]["lua"]]
    assert (lua["type"], lua["valueRef"]["kind"]) == ("ValueRef", "ConfigMap")
    assert _one(objects, "ConfigMap", lua["valueRef"]["name"])["data"] == {"lua": usage_lua()}
    (proxy,) = _find(objects, "EnvoyProxy")
    settings = proxy["spec"]["telemetry"]["accessLog"]["settings"]
    als = settings[0]["sinks"][0]
    assert als["type"] == "ALS"
    assert (als["als"]["type"], als["als"]["logName"]) == ("HTTP", ACCESS_LOG_NAME)
    assert als["als"]["backendRefs"] == ext_proc["backendRefs"]
    # Any access log setting replaces Envoy Gateway's default stdout one: it is kept by hand.
    sinks = [sink for setting in settings for sink in setting["sinks"]]
    assert {"type": "File", "file": {"path": "/dev/stdout"}} in sinks
    (patch_policy,) = _find(objects, "EnvoyPatchPolicy")
    sockets = {
        p["name"]: p["operation"]
        for p in patch_policy["spec"]["jsonPatches"]
        if p["type"].endswith("Cluster") and p["operation"]["path"] == "/transport_socket"
    }
    ext_proc_cluster = (
        f"envoyextensionpolicy/{extension['metadata']['namespace']}/{extension['metadata']['name']}/extproc/0"
    )
    if tls:
        assert sockets[ALS_CLUSTER] == sockets[ext_proc_cluster]
    else:
        assert sockets == {}
    return proxy


def _eg_lua_validation(code: str, *, content_type: str | None = None) -> None:
    """Envoy Gateway's Strict Lua validation, as v1.9.0 runs it before accepting a policy's Lua
    (internal/gatewayapi/luavalidator/lua_validator.go, LuaValidator.Validate and runLua): its mocks of
    Envoy's Lua API, its security wrappers, then the code with each entry point it defines called on the
    mock StreamHandle; ``print`` silenced. In Lua 5.1, gopher-lua's dialect. ``content_type``: the mock
    headers' answer instead of theirs ("example_value"), to run a filter's body path too. Raises
    lupa.lua51.LuaError where Envoy Gateway would refuse the policy."""
    mocks = (EG_LUA_VALIDATOR / "mocks.lua").read_text(encoding="utf-8")
    if content_type is not None:
        theirs = 'function Headers:get(key)\n  return "example_value"\nend'
        assert theirs in mocks
        mocks = mocks.replace(theirs, f"function Headers:get(key)\n  return {json.dumps(content_type)}\nend")
    entry_points = [name for name in ("envoy_on_request", "envoy_on_response") if name in code]
    assert entry_points
    for name in entry_points:
        lua = lupa.lua51.LuaRuntime()
        lua.execute(mocks)
        lua.execute((EG_LUA_VALIDATOR / "security.lua").read_text(encoding="utf-8"))
        lua.execute("print = function() end")
        lua.execute(f"{code}\n{name}(StreamHandle)")


@pytest.mark.parametrize("content_type", [None, "application/json", "text/event-stream"])
def test_envoy_gateway_s_lua_validation_accepts_the_usage_filter(content_type: str | None) -> None:
    _eg_lua_validation(usage_lua(), content_type=content_type)


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("function envoy_on_response(handle) handle:bodyChunk() end", "bodyChunk"),
        ("function envoy_on_response(handle) io.open('/etc/passwd') end", "/etc"),
        (
            "function envoy_on_response(handle) handle:streamInfo():dynamicMetadata():set( end",
            "unexpected symbol",
        ),
    ],
)
def test_envoy_gateway_s_lua_validation_refuses_what_it_would(code: str, message: str) -> None:
    with pytest.raises(lupa.lua51.LuaError, match=message):
        _eg_lua_validation(code)


@pytest.mark.parametrize(
    "bootstrap", ["base/picker-tls-proxy.yaml", "components/picker-mtls/picker-tls-proxy.yaml"]
)
def test_the_picker_s_tls_sidecar_passes_ext_proc_and_the_access_log(bootstrap: str) -> None:
    # Both gRPC services the gateways call on the picker's port, with no route timeout (both streams
    # last: a request's, an Envoy worker's batches of access log entries).
    proxy = yaml.safe_load((K8S / bootstrap).read_text(encoding="utf-8"))
    (listener,) = proxy["static_resources"]["listeners"]
    ((hcm,),) = [chain["filters"] for chain in listener["filter_chains"]]
    (cluster,) = proxy["static_resources"]["clusters"]
    routes = [r for vh in hcm["typed_config"]["route_config"]["virtual_hosts"] for r in vh["routes"]]
    for path in (PROCESS_PATH, ACCESS_LOG_PATH):
        route = next(r for r in routes if path.startswith(r["match"]["prefix"]))
        assert route["route"] == {"cluster": cluster["name"], "timeout": "0s"}, path


@pytest.mark.parametrize(("copy", "source"), makefile_copies("K8S_FILES"), ids=lambda p: p.name)
def test_each_kustomize_copy_is_its_source(copy: Path, source: Path) -> None:
    assert file_tree(copy) == file_tree(source), f"run `make chart-files`: {copy} differs from {source}"


def test_every_copy_of_the_lua_filter_is_deploy_envoy_s_and_the_makefile_s() -> None:
    source = REPO / "deploy/envoy/usage.lua"
    copies = {p for p in (REPO / "deploy").rglob("*.lua") if p != source}
    listed = {
        c
        for c, s in [
            *makefile_copies("K8S_FILES"),
            *makefile_copies("CHART_FILES", REPO / "deploy/helm/pointsman"),
        ]
        if s == source
    }
    assert copies == listed
    assert {p.read_bytes() for p in copies} == {source.read_bytes()}


def test_the_grafana_dashboards_ship_as_a_config_map() -> None:
    config_map = _one(_objects("base"), "ConfigMap", "pointsman-grafana-dashboards")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = set(config_map["data"])
    assert shipped == {p.name for p in (REPO / "deploy/grafana/dashboards").glob("*.json")}


@pytest.mark.parametrize("target", TARGETS)
def test_every_pod_meets_the_restricted_pod_security_standard(target: str) -> None:
    # The namespace enforces `restricted`: a pod that misses one of these is refused at admission.
    assert (
        _one(_objects("base"), "Namespace", "pointsman")["metadata"]["labels"][
            "pod-security.kubernetes.io/enforce"
        ]
        == "restricted"
    )
    for workload in _objects(target):
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
    # upstream's health service names, as the picker serves them
    assert (picker["readinessProbe"]["grpc"]["service"], picker["livenessProbe"]["grpc"]["service"]) == (
        "readiness",
        LIVENESS,
    )
    assert "readiness" in READINESS_SERVICES
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
    for target in POOL_TARGETS:
        assert _pointsman_config(_objects(target)).models == local.models, target


CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "GatewayClass",
    "ClusterRole",
    "ClusterRoleBinding",
}


@pytest.mark.parametrize("target", TARGETS)
def test_namespaced_objects_are_in_pointsman_and_cluster_scoped_ones_in_none(target: str) -> None:
    for obj in _objects(target):
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] in CLUSTER_SCOPED:
            assert namespace is None, f"{obj['kind']}/{obj['metadata']['name']}"
        else:
            assert namespace == "pointsman", f"{obj['kind']}/{obj['metadata']['name']}"


@pytest.mark.parametrize("pool", ["overlays/sim", "overlays/vllm"])
def test_the_tracing_component_turns_tracing_on_everywhere_and_nothing_traces_without_it(pool: str) -> None:
    kubectl = Path(sys.executable).parent / "kubectl"
    traced = _build_kustomization({"resources": [pool], "components": ["components/tracing"]}, kubectl)
    for name in ("pointsman-picker", "pointsman-collector"):
        for objects, on in ((list(traced), True), (_objects(pool), False)):
            container = _one(objects, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert ("--tracing" in container["args"]) is on, name
            assert ("OTEL_EXPORTER_OTLP_ENDPOINT" in env) is on, name
            if on:  # what the service makes of it: the flag and the variables, through the real loader
                args = upstream_args(container["args"])
                config = parse_config(
                    upstream.with_overrides({}, upstream.overrides(args)),
                    environ={k: v for k, v in env.items() if v is not None},
                ).tracing
                assert (config.enabled, config.endpoint, config.ratio) == (
                    True,
                    "http://otel-collector.observability:4317",
                    0.1,
                )
    server = _one(list(traced), "Deployment", "model-server")["spec"]["template"]["spec"]["containers"][0]
    assert "--otlp-traces-endpoint=http://otel-collector.observability:4317" in server["args"]
    untraced = _one(_objects(pool), "Deployment", "model-server")["spec"]["template"]["spec"]["containers"][0]
    assert not any(arg.startswith("--otlp-traces-endpoint") for arg in untraced["args"])


def upstream_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    upstream.add_flags(parser, metrics_field="picker.metricsListen", grpc=True)
    return parser.parse_args(argv)


def test_the_standalone_envoy_tracing_component_swaps_in_the_traced_bootstrap() -> None:
    kubectl = Path(sys.executable).parent / "kubectl"
    spec = {"resources": ["overlays/standalone-envoy"], "components": ["components/standalone-envoy-tracing"]}

    def envoy_config(objects: Objects) -> dict[str, Any]:
        (found,) = [
            o
            for o in objects
            if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("pointsman-envoy")
        ]
        return found

    traced = envoy_config(list(_build_kustomization(spec, kubectl)))
    plain = envoy_config(_objects("overlays/standalone-envoy"))
    expected = (K8S / "components/standalone-envoy-tracing/envoy-tracing.yaml").read_text(encoding="utf-8")
    assert traced["data"]["envoy.yaml"] == expected
    assert "envoy.tracers.opentelemetry" not in plain["data"]["envoy.yaml"]
