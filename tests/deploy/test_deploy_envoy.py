"""Every Envoy bootstrap in the repository passes ``envoy --mode validate``, and the generated ones are
up to date."""

from __future__ import annotations

from pathlib import Path

import pytest
from deploy_kit import REPO, load_all_yaml, load_yaml

from pointsman_devstack import deploy, envoy

# The Helm chart's templates are not YAML until rendered, and its files/ link to the bootstraps here.
BOOTSTRAPS = sorted(
    path
    for path in (REPO / "deploy").rglob("*.yaml")
    if "helm" not in path.relative_to(REPO).parts
    and any("static_resources" in doc for doc in load_all_yaml(path) if isinstance(doc, dict))
)


def test_every_variant_is_found() -> None:
    names = {p.relative_to(REPO).as_posix() for p in BOOTSTRAPS}
    assert names >= {
        "deploy/envoy/envoy.yaml",
        "deploy/envoy/envoy-compose.yaml",
        "deploy/k8s/base/picker-tls-proxy.yaml",
        "deploy/k8s/overlays/standalone-envoy/envoy.yaml",
    }


@pytest.mark.parametrize("path", BOOTSTRAPS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_envoy_accepts(path: Path, picker_tls: Path, tmp_path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    if deploy.KUBERNETES_TLS_DIR in text:
        # The Secret's mount point in the pod, here the certificates made above.
        path = tmp_path / path.name
        path.write_text(text.replace(deploy.KUBERNETES_TLS_DIR, str(picker_tls)), encoding="utf-8")
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


def test_the_standalone_kubernetes_bootstrap_is_up_to_date() -> None:
    expected = deploy.kubernetes_config("deploy/k8s/base/pointsman.yaml", root=REPO)
    actual = (REPO / "deploy/k8s/overlays/standalone-envoy/envoy.yaml").read_text(encoding="utf-8")
    assert actual == expected, (
        "regenerate: .venv/bin/python -m pointsman_devstack.deploy --variant kubernetes"
    )


def test_the_standalone_bootstrap_verifies_the_picker_certificate() -> None:
    doc = load_yaml(REPO / "deploy/k8s/overlays/standalone-envoy/envoy.yaml")
    (picker,) = [c for c in doc["static_resources"]["clusters"] if c["name"] == envoy.PICKER_CLUSTER]
    tls = picker["transport_socket"]["typed_config"]
    assert tls["sni"] == deploy.KUBERNETES_PICKER
    validation = tls["common_tls_context"]["validation_context"]
    assert validation["trusted_ca"]["filename"] == f"{deploy.KUBERNETES_TLS_DIR}/ca.crt"
