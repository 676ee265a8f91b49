"""The Grafana dashboards chart only series the services really export, and every panel is labelled."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from deploy_kit import DASHBOARDS, PROMETHEUS_SERIES, REPO, dashboard_panels, load_yaml, promql_metric_names

DASHBOARD_FILES = sorted(DASHBOARDS.glob("*.json"))
# Upstream's dashboard as GIE v1.5.0 ships it (its README says where from); the integration tests run its
# panels against the stack (tests/integration/test_dashboards.py).
UPSTREAM_DASHBOARD = REPO / "tests/deploy/data/upstream-dashboards/inference_gateway.json"
UPSTREAM_DASHBOARD_SHA256 = "6b2049f818394279ef8eac6142ed08d8992244fc7f70cba5142332a435ffa8bd"
_LABEL_VALUES = re.compile(r"label_values\(\s*([A-Za-z_:][\w:]*)")


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    found = [
        (f"panel {panel.get('title')!r}", target["expr"])
        for panel in dashboard_panels(dashboard)
        for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            found += [(f"variable {variable['name']}", m) for m in _LABEL_VALUES.findall(query)]
    return found


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        ('sum by (reason) (rate(a_total{job="x", reason=~"a|b"}[$__rate_interval]))', {"a_total"}),
        ("histogram_quantile(0.99, sum by (le) (rate(vllm:ttft_bucket[5m])))", {"vllm:ttft_bucket"}),
        ('count(h{pool="$pool"} == 0) or vector(0)', {"h"}),
        ('max by (name) (a{name="${pool}"}) / on (name) b', {"a", "b"}),
        ("sum(deriv(v[1m])) > bool 1", {"v"}),
    ],
)
def test_promql_metric_names(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names


def test_there_are_dashboards_for_pool_collector_and_picker() -> None:
    assert {p.stem for p in DASHBOARD_FILES} >= {"pointsman-pool", "pointsman-collector", "pointsman-picker"}


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_every_query_uses_only_exported_series(path: Path, exported_metrics: frozenset[str]) -> None:
    unknown = [
        (where, name)
        for where, expr in _expressions(_load(path))
        for name in sorted(promql_metric_names(expr))
        if name not in exported_metrics and name not in PROMETHEUS_SERIES
    ]
    assert not unknown, f"series no service exports: {unknown}"


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_every_panel_has_a_title_a_unit_and_a_query(path: Path) -> None:
    problems = []
    for panel in dashboard_panels(_load(path)):
        if panel.get("type") == "row":
            continue
        name = panel.get("title") or f"panel id {panel.get('id')}"
        if not panel.get("title"):
            problems.append((name, "no title"))
        if not panel.get("fieldConfig", {}).get("defaults", {}).get("unit"):
            problems.append((name, "no unit"))
        if not [t for t in panel.get("targets", []) if t.get("expr")]:
            problems.append((name, "no query"))
    assert not problems


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_panels_take_the_datasource_from_the_variable(path: Path) -> None:
    # A fixed datasource uid would break the dashboards under any Prometheus but the compose one.
    dashboard = _load(path)
    assert [v["name"] for v in dashboard["templating"]["list"] if v["type"] == "datasource"] == ["datasource"]
    for panel in dashboard_panels(dashboard):
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    ids = [panel["id"] for panel in dashboard_panels(dashboard)]
    assert len(ids) == len(set(ids))


def test_dashboard_uids_are_unique() -> None:
    uids = [_load(p)["uid"] for p in DASHBOARD_FILES]
    assert len(uids) == len(set(uids))


def test_compose_provisions_the_dashboard_folder() -> None:
    provider = load_yaml(REPO / "deploy/grafana/provisioning/dashboards/pointsman.yaml")["providers"][0]
    compose = load_yaml(REPO / "docker-compose.yaml")
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./deploy/grafana/dashboards:{provider['options']['path']}:ro" in mounts


def test_the_upstream_dashboard_is_the_releases_file() -> None:
    digest = hashlib.sha256(UPSTREAM_DASHBOARD.read_bytes()).hexdigest()
    assert digest == UPSTREAM_DASHBOARD_SHA256, "changed: refresh it as its README says"
    readme = (UPSTREAM_DASHBOARD.parent / "README.md").read_text(encoding="utf-8")
    assert UPSTREAM_DASHBOARD_SHA256 in readme


def test_every_upstream_query_names_its_series() -> None:
    # The integration test reports a panel without data by the series Prometheus lacks: these names.
    expressions = _expressions(_load(UPSTREAM_DASHBOARD))
    assert len(expressions) > 40
    unnamed = [(where, expr) for where, expr in expressions if not promql_metric_names(expr)]
    assert not unnamed
    names = {name for _, expr in expressions for name in promql_metric_names(expr)}
    assert {"inference_objective_request_total", "inference_pool_per_pod_queue_size"} <= names
    assert all(re.fullmatch(r"[A-Za-z_:][\w:]*", name) for name in names), names
