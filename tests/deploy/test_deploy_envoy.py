"""Every Envoy bootstrap in the repository passes ``envoy --mode validate``."""

from __future__ import annotations

from pathlib import Path

import pytest
from deploy_kit import REPO, load_yaml

from pointsman_devstack import envoy

BOOTSTRAPS = sorted(
    path
    for path in (REPO / "deploy").rglob("*.yaml")
    if isinstance(doc := load_yaml(path), dict) and "static_resources" in doc
)


def test_the_compose_and_local_bootstraps_are_found() -> None:
    names = {p.relative_to(REPO).as_posix() for p in BOOTSTRAPS}
    assert {"deploy/envoy/envoy.yaml", "deploy/envoy/envoy-compose.yaml"} <= names


@pytest.mark.parametrize("path", BOOTSTRAPS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_envoy_accepts(path: Path) -> None:
    envoy.validate(path)


@pytest.mark.parametrize("path", BOOTSTRAPS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_clusters_dialling_names_resolve_them_with_dns(path: Path) -> None:
    # A STATIC cluster takes only IP addresses; a host name there fails only when Envoy starts for real.
    for cluster in load_yaml(path)["static_resources"]["clusters"]:
        if cluster.get("type", "STATIC") != "STATIC":
            continue
        for group in cluster.get("load_assignment", {}).get("endpoints", []):
            for endpoint in group["lb_endpoints"]:
                host = endpoint["endpoint"]["address"]["socket_address"]["address"]
                assert host.replace(".", "").isdigit() or ":" in host, f"{cluster['name']}: {host}"
