"""What the deploy tests share: the repository's paths, YAML loading, PromQL metric-name extraction, the
Makefile's lists of copied files, and the upstream CRD schemas (GIE's, Envoy Gateway's) with a validator
that checks custom resources as the API server would."""

from __future__ import annotations

import functools
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yaml"
DASHBOARDS = REPO / "deploy/grafana/dashboards"
SERVICES = ("collector", "picker", "simulator")

# Series Prometheus makes itself for every target, not exported by any service.
PROMETHEUS_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})

_PROMQL_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
)
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_VARIABLES = re.compile(r"\$\{?\w+\}?")
_IDENTIFIER = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?")


_INSTRUCTION = re.compile(r"^([A-Z]+)\s+(.*)$")


def dockerfile_instructions(service: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of ``services/<service>/Dockerfile``, continuation lines joined."""
    text = (REPO / "services" / service / "Dockerfile").read_text(encoding="utf-8")
    lines = [s for s in text.splitlines() if not s.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [(m.group(1), m.group(2)) for s in joined.splitlines() if (m := _INSTRUCTION.match(s.strip()))]


def dockerfile_env(service: str) -> dict[str, str]:
    """The ENV values a Dockerfile sets (``KEY=value`` pairs)."""
    env = {}
    for op, args in dockerfile_instructions(service):
        if op == "ENV":
            env.update(pair.split("=", 1) for pair in args.split())
    return env


def make_picker_tls(directory: Path) -> Path:
    """Certificates made the way docs/deploy.md says: a private CA and the picker Service's certificate."""
    script = REPO / "deploy/k8s/picker-tls.sh"
    subprocess.run([str(script), str(directory)], check=True, capture_output=True)
    return directory


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def load_all_yaml(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords and label names left out)."""
    text = _VARIABLES.sub("x", expr)
    text = _STRINGS.sub('""', text)
    text = _MATCHERS.sub("", text)
    text = _RANGES.sub("", text)
    text = _GROUPING.sub("", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        name, call = match.groups()
        if call is None and name not in _PROMQL_KEYWORDS:
            names.add(name)
    return names


def dashboard_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside rows included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


# --- the Gateway API Inference Extension's CRDs --------------------------------------------------------

# One directory per GIE release, each its config/crd/bases/*.yaml and a README naming tag and commit.
GIE_CRDS = REPO / "tests/deploy/data/gie-crds"
GIE_RELEASES = ("v0.5.1", "v1.0.2", "v1.3.1", "v1.5.0", "v1.6.0")
INFERENCE_GROUPS = frozenset({"inference.networking.k8s.io", "inference.networking.x-k8s.io"})


@functools.cache
def gie_crd_schemas(release: str) -> dict[tuple[str, str], dict[str, Any]]:
    """``(apiVersion, kind)`` to the openAPIV3Schema of each version the release's CRDs serve."""
    return _crd_schemas(GIE_CRDS / release)


def _crd_schemas(directory: Path) -> dict[tuple[str, str], dict[str, Any]]:
    schemas = {}
    for path in sorted(directory.glob("*.yaml")):
        crd = load_yaml(path)
        assert crd["kind"] == "CustomResourceDefinition", path
        for version in crd["spec"]["versions"]:
            if version["served"]:
                key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
                schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


def is_gie_kind(obj: dict[str, Any]) -> bool:
    """Whether the object's kind is the GIE's (by API group), served by some release or not."""
    return str(obj.get("apiVersion", "")).split("/")[0] in INFERENCE_GROUPS


# --- Envoy Gateway's CRDs ------------------------------------------------------------------------------

# The release the envoy-gateway overlay and the chart's Envoy Gateway objects are written for and checked
# against (docs/deploy.md): its charts/gateway-helm CRDs of the kinds rendered, with a README naming the
# commit.
EG_CRDS = REPO / "tests/deploy/data/eg-crds"
EG_RELEASE = "v1.9.0"
# Its Lua validator's mocks of Envoy's Lua API and security wrappers (internal/gatewayapi/luavalidator).
EG_LUA_VALIDATOR = EG_CRDS / EG_RELEASE / "luavalidator"
ENVOY_GATEWAY_GROUP = "gateway.envoyproxy.io"


@functools.cache
def eg_crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """``(apiVersion, kind)`` to the openAPIV3Schema of the pinned Envoy Gateway release's CRDs."""
    return _crd_schemas(EG_CRDS / EG_RELEASE)


def is_eg_kind(obj: dict[str, Any]) -> bool:
    return str(obj.get("apiVersion", "")).split("/")[0] == ENVOY_GATEWAY_GROUP


def crd_problems(
    objects: list[dict[str, Any]],
    schemas: dict[tuple[str, str], dict[str, Any]],
    kind: Callable[[dict[str, Any]], bool],
) -> list[str]:
    """Why some object of ``objects`` that ``kind`` picks would not apply with ``schemas``' CRDs."""
    problems = []
    for obj in filter(kind, objects):
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        schema = schemas.get((obj["apiVersion"], obj["kind"]))
        if schema is None:
            problems.append(f"{where}: no matches for kind {obj['kind']!r} in version {obj['apiVersion']!r}")
        else:
            problems += [f"{where}: {problem}" for problem in custom_resource_problems(obj, schema)]
    return problems


def eg_problems(objects: list[dict[str, Any]]) -> list[str]:
    """Why some Envoy Gateway object of ``objects`` would not apply with the pinned release's CRDs."""
    return crd_problems(objects, eg_crd_schemas(), is_eg_kind)


# --- the Makefile's copies -----------------------------------------------------------------------------


def makefile_copies(variable: str, root: Path = REPO) -> list[tuple[Path, Path]]:
    """A ``DEST=SOURCE`` list of the Makefile (CHART_FILES, K8S_FILES) as (copy, source), DEST taken from
    ``root`` and SOURCE from the repository's top."""
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    block = re.search(rf"^{variable} := \\\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert block, variable
    pairs = [line.strip().rstrip("\\").strip().split("=") for line in block.group(1).splitlines()]
    return [(root / dest, REPO / src) for dest, src in pairs]


def file_tree(path: Path) -> dict[str, bytes]:
    """A file's bytes, or a directory's files' by their relative paths."""
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _ports_unique(ports: list[dict[str, Any]]) -> bool:
    numbers = [p.get("number") for p in ports]
    return len(numbers) == len(set(numbers))


# Envoy Gateway's policies attach to these kinds; mergeType only to routes.
_EG_TARGETS = frozenset(
    {"Gateway", "ListenerSet", "HTTPRoute", "GRPCRoute", "UDPRoute", "TCPRoute", "TLSRoute"}
)
_EG_ROUTES = _EG_TARGETS - {"Gateway", "ListenerSet"}
_EG_ADMISSION_TARGETS = frozenset({"Gateway", "ListenerSet", "HTTPRoute", "GRPCRoute"})


def _eg_targets_are(spec: dict[str, Any], kinds: frozenset[str]) -> bool:
    """Every targetRef, targetRefs entry and targetSelectors entry names one of ``kinds``."""
    refs = [spec["targetRef"]] if "targetRef" in spec else []
    refs += spec.get("targetRefs", []) + spec.get("targetSelectors", [])
    return all(ref["kind"] in kinds for ref in refs)


def _eg_one_target(spec: dict[str, Any]) -> bool:
    return (("targetRef" in spec) != ("targetRefs" in spec)) or bool(spec.get("targetSelectors"))


def _refs_kinds(*kinds: str) -> Callable[[Any], bool]:
    # "has(self.backendRefs) ? self.backendRefs.all(f, f.kind == K1 || ...) : true"
    return lambda value: all(r.get("kind", "Service") in kinds for r in value.get("backendRefs", []))


def _refs_groups(*groups: str) -> Callable[[Any], bool]:
    # "has(self.backendRefs) ? (self.backendRefs.all(f, f.group == G1 || ...)) : true"
    return lambda value: all(r.get("group", "") in groups for r in value.get("backendRefs", []))


def _only_one_sink(kind: str, field: str) -> Callable[[Any], bool]:
    # "self.type == KIND ? has(self.FIELD) : !has(self.FIELD)"
    return lambda sink: (field in sink) is (sink.get("type") == kind)


def _eg_full_duplex_fails_closed(ext_proc: dict[str, Any]) -> bool:
    modes = ext_proc.get("processingMode", {})
    full_duplex = any(
        modes.get(side, {}).get("body") == "FullDuplexStreamed" for side in ("request", "response")
    )
    return not (ext_proc.get("failOpen") is True and full_duplex)


def _eg_shadow_streams(ext_proc: dict[str, Any]) -> bool:
    modes = ext_proc.get("processingMode", {})
    bodies = [modes.get(side, {}).get("body") for side in ("request", "response")]
    return not (ext_proc.get("shadowMode") is True and any(b not in (None, "Streamed") for b in bodies))


def _eg_preconnect_balanced(settings: dict[str, Any]) -> bool:
    predictive = "predictivePercent" in settings.get("connection", {}).get("preconnect", {})
    balancer = settings.get("loadBalancer", {}).get("type") in ("Random", "RoundRobin")
    return not (predictive and not balancer)


def _eg_lua_source(lua: dict[str, Any]) -> bool:
    inline, ref = "inline" in lua, "valueRef" in lua
    return (lua["type"] == "Inline" and inline and not ref) or (
        lua["type"] == "ValueRef" and ref and not inline
    )


# The CEL rules (x-kubernetes-validations) of the GIE CRDs and of Envoy Gateway's (only those on fields
# the manifests here set), as Python: jsonschema does not read CEL. A rule not in this table fails
# validation, so a new one in a refreshed CRD, or on a field newly set, is noticed, not skipped. Rules
# are looked up without surrounding spaces (Envoy Gateway's CRDs end some with one).
_CEL_RULES: dict[str, Callable[[Any], bool]] = {
    # Transition rules compare with the stored object: always true on create.
    "self == oldSelf": lambda _value: True,
    "self.kind != 'Service' || has(self.port)": lambda ref: (
        ref.get("kind", "Service") != "Service" or "port" in ref
    ),
    "self.all(p1, self.exists_one(p2, p1.number==p2.number))": _ports_unique,
    "self.all(model, has(model.weight)) || self.all(model, !has(model.weight))": lambda models: (
        len({"weight" in m for m in models}) <= 1
    ),
    # Envoy Gateway v1.9.0: the policies' targets (BackendTrafficPolicy, EnvoyExtensionPolicy).
    "(has(self.targetRef) && !has(self.targetRefs)) || (!has(self.targetRef) && has(self.targetRefs)) || "
    "(has(self.targetSelectors) && self.targetSelectors.size() > 0)": _eg_one_target,
    "has(self.targetRef) ? self.targetRef.group == 'gateway.networking.k8s.io' : true": lambda spec: (
        spec.get("targetRef", {}).get("group", "gateway.networking.k8s.io") == "gateway.networking.k8s.io"
    ),
    "has(self.targetRef) ? self.targetRef.kind in ['Gateway', 'ListenerSet', 'HTTPRoute', 'GRPCRoute', "
    "'UDPRoute', 'TCPRoute', 'TLSRoute'] : true": lambda spec: (
        "targetRef" not in spec or spec["targetRef"]["kind"] in _EG_TARGETS
    ),
    "has(self.targetRefs) ? self.targetRefs.all(ref, ref.group == 'gateway.networking.k8s.io') : true": (
        lambda spec: all(r["group"] == "gateway.networking.k8s.io" for r in spec.get("targetRefs", []))
    ),
    "has(self.targetRefs) ? self.targetRefs.all(ref, ref.kind in ['Gateway', 'ListenerSet', 'HTTPRoute', "
    "'GRPCRoute', 'UDPRoute', 'TCPRoute', 'TLSRoute']) : true": lambda spec: all(
        r["kind"] in _EG_TARGETS for r in spec.get("targetRefs", [])
    ),
    "!has(self.mergeType) || ((!has(self.targetRef) || self.targetRef.kind in ['HTTPRoute', 'GRPCRoute', "
    "'UDPRoute', 'TCPRoute', 'TLSRoute']) && (!has(self.targetRefs) || self.targetRefs.all(ref, ref.kind in "
    "['HTTPRoute', 'GRPCRoute', 'UDPRoute', 'TCPRoute', 'TLSRoute'])) && (!has(self.targetSelectors) || "
    "self.targetSelectors.all(sel, sel.kind in ['HTTPRoute', 'GRPCRoute', 'UDPRoute', 'TCPRoute', "
    "'TLSRoute'])))": lambda spec: "mergeType" not in spec or _eg_targets_are(spec, _EG_ROUTES),
    "!has(self.admissionControl) || ((!has(self.targetRef) || self.targetRef.kind in ['Gateway', "
    "'ListenerSet', 'HTTPRoute', 'GRPCRoute']) && (!has(self.targetRefs) || self.targetRefs.all(ref, "
    "ref.kind in ['Gateway', 'ListenerSet', 'HTTPRoute', 'GRPCRoute'])) && (!has(self.targetSelectors) || "
    "self.targetSelectors.all(sel, sel.kind in ['Gateway', 'ListenerSet', 'HTTPRoute', 'GRPCRoute'])))": (
        lambda spec: "admissionControl" not in spec or _eg_targets_are(spec, _EG_ADMISSION_TARGETS)
    ),
    # BackendTrafficPolicy, and the backendSettings of an extProc.
    "!has(self.compression) || !has(self.compressor)": lambda spec: (
        not {"compression", "compressor"} <= set(spec)
    ),
    "!has(self.requestBuffer) || !has(self.httpUpgrade) || self.httpUpgrade.size() == 0": lambda spec: (
        "requestBuffer" not in spec or not spec.get("httpUpgrade")
    ),
    "!((has(self.connection) && has(self.connection.preconnect) && has(self.connection.preconnect."
    "predictivePercent)) && !(has(self.loadBalancer) && has(self.loadBalancer.type) && "
    "self.loadBalancer.type in ['Random', 'RoundRobin']))": _eg_preconnect_balanced,
    # EnvoyExtensionPolicy's extProc and lua.
    "!has(self.backendRef)": lambda value: "backendRef" not in value,
    "has(self.backendRefs) ? self.backendRefs.all(f, f.kind == 'Service' || f.kind == 'ServiceImport' || "
    "f.kind == 'Backend') : true": _refs_kinds("Service", "ServiceImport", "Backend"),
    'has(self.backendRefs) ? (self.backendRefs.all(f, f.group == "" || '
    "f.group == 'multicluster.x-k8s.io' || f.group == 'gateway.envoyproxy.io')) : true": _refs_groups(
        "", "multicluster.x-k8s.io", ENVOY_GATEWAY_GROUP
    ),
    "!(has(self.failOpen) && self.failOpen == true && has(self.processingMode) && ((has(self.processingMode."
    "request) && has(self.processingMode.request.body) && self.processingMode.request.body == "
    "'FullDuplexStreamed') || (has(self.processingMode.response) && "
    "has(self.processingMode.response.body) && self.processingMode.response.body == "
    "'FullDuplexStreamed')))": _eg_full_duplex_fails_closed,
    "!(has(self.shadowMode) && self.shadowMode == true && has(self.processingMode) && ((has(self."
    "processingMode.request) && has(self.processingMode.request.body) && self.processingMode.request.body != "
    "'Streamed') || (has(self.processingMode.response) && has(self.processingMode.response.body) && "
    "self.processingMode.response.body != 'Streamed')))": _eg_shadow_streams,
    "(size(self.group) == 0 && self.kind == 'Service') ? has(self.port) : true": lambda ref: (
        not (ref.get("group", "") == "" and ref.get("kind", "Service") == "Service") or "port" in ref
    ),
    "self.all(f, !f.startsWith('envoy.filters.http'))": lambda names: (
        not any(n.startswith("envoy.filters.http") for n in names)
    ),
    "(self.type == 'Inline' && has(self.inline) && !has(self.valueRef)) || (self.type == 'ValueRef' && "
    "!has(self.inline) && has(self.valueRef))": _eg_lua_source,
    "self.kind == 'ConfigMap' && (self.group == 'v1' || self.group == '')": lambda ref: (
        ref["kind"] == "ConfigMap" and ref["group"] in ("v1", "")
    ),
    # EnvoyProxy.
    "!(has(self.mergeGateways) && self.mergeGateways && has(self.mergeBackends))": lambda spec: (
        not (spec.get("mergeGateways") is True and "mergeBackends" in spec)
    ),
    "self.type == 'ALS' ? has(self.als) : !has(self.als)": _only_one_sink("ALS", "als"),
    "self.type == 'File' ? has(self.file) : !has(self.file)": _only_one_sink("File", "file"),
    "self.type == 'OpenTelemetry' ? has(self.openTelemetry) : !has(self.openTelemetry)": _only_one_sink(
        "OpenTelemetry", "openTelemetry"
    ),
    "self.type == 'HTTP' || !has(self.http)": lambda als: als["type"] == "HTTP" or "http" not in als,
    "has(self.backendRefs) && self.backendRefs.size() > 0": lambda value: bool(value.get("backendRefs")),
    "has(self.backendRefs) ? self.backendRefs.all(f, f.kind == 'Service' || f.kind == 'Backend') : true": (
        _refs_kinds("Service", "Backend")
    ),
    'has(self.backendRefs) ? (self.backendRefs.all(f, f.group == "" || '
    "f.group == 'gateway.envoyproxy.io')) : true": _refs_groups("", ENVOY_GATEWAY_GROUP),
}


def custom_resource_problems(obj: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """What the API server would refuse in ``obj`` under a CRD's ``schema``, with kubectl's default strict
    field validation: schema errors, unknown fields (which the server would otherwise prune silently),
    and failed CEL rules. Empty when it would be accepted."""
    problems = [
        f"{'.'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}"
        for error in jsonschema.Draft7Validator(schema).iter_errors(obj)
    ]
    _structural(obj, schema, "", problems)
    return problems


def _structural(value: Any, schema: dict[str, Any], path: str, problems: list[str]) -> None:
    for rule in schema.get("x-kubernetes-validations", []):
        check = _CEL_RULES.get(rule["rule"].strip())
        if check is None:
            problems.append(f"{path or '<root>'}: no check here for the CEL rule {rule['rule']!r}")
        elif not check(value):
            problems.append(f"{path or '<root>'}: {rule.get('message', rule['rule'])}")
    if isinstance(value, dict) and "properties" in schema:
        known = schema["properties"]
        for key, item in value.items():
            if key in known:
                _structural(item, known[key], f"{path}.{key}" if path else key, problems)
            elif (
                not schema.get("x-kubernetes-preserve-unknown-fields")
                and "additionalProperties" not in schema
            ):
                problems.append(f"{path or '<root>'}: unknown field {key!r}")
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, item in value.items():
            _structural(item, schema["additionalProperties"], f"{path}.{key}", problems)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _structural(item, schema["items"], f"{path}[{i}]", problems)


# --- Pod Security Standards ----------------------------------------------------------------------------

# The volume types the `restricted` profile allows.
_RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)


def restricted_pod_problems(pod: dict[str, Any]) -> list[str]:
    """Why a pod spec would be refused in a namespace enforcing the `restricted` Pod Security Standard
    (kubernetes.io/docs/concepts/security/pod-security-standards); empty when it would be admitted."""
    problems = []
    context = pod.get("securityContext", {})
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            problems.append(f"{flag} is set")
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= _RESTRICTED_VOLUMES:
            problems.append(f"volume {volume['name']}: {sorted(kinds - _RESTRICTED_VOLUMES)}")
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        name = container["name"]
        own = container.get("securityContext", {})

        def setting(key: str, own: dict[str, Any] = own) -> Any:
            return own.get(key, context.get(key))

        if setting("runAsNonRoot") is not True:
            problems.append(f"{name}: runAsNonRoot is not true")
        if setting("runAsUser") == 0:
            problems.append(f"{name}: runAsUser is 0")
        if (setting("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile is not RuntimeDefault or Localhost")
        if own.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        if own.get("privileged"):
            problems.append(f"{name}: privileged")
        capabilities = own.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            problems.append(f"{name}: capabilities do not drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: capabilities add {capabilities['add']}")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            problems.append(f"{name}: hostPort")
    return problems
