"""What the deploy tests share: the repository's paths, YAML loading, PromQL metric-name extraction, and
the upstream (GIE) CRD schemas with a validator that checks custom resources as the API server would."""

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
    schemas = {}
    for path in sorted((GIE_CRDS / release).glob("*.yaml")):
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


def _ports_unique(ports: list[dict[str, Any]]) -> bool:
    numbers = [p.get("number") for p in ports]
    return len(numbers) == len(set(numbers))


# The CEL rules (x-kubernetes-validations) of the GIE CRDs, as Python: jsonschema does not read CEL. A
# rule not in this table fails validation, so a new one in a refreshed CRD is noticed, not skipped.
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
        check = _CEL_RULES.get(rule["rule"])
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
