"""What the deploy tests share: the repository's paths, YAML loading, PromQL metric-name extraction."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
