"""Every Envoy bootstrap in the repository passes ``envoy --mode validate``, and the generated ones are
up to date; every Envoy a client talks to (the bootstraps, and Envoy Gateway's through its patch policy)
answers its own errors in JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deploy_kit import REPO, load_all_yaml, load_yaml
from test_deploy_tls import localized

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
    # The pod's mounts (the TLS Secret, the sidecar's SDS files) here: the certificates made above.
    envoy.validate(localized(path, picker_tls, tmp_path))


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


def test_the_standalone_tracing_bootstrap_is_up_to_date_and_the_standalone_one_plus_the_tracer() -> None:
    path = "deploy/k8s/components/standalone-envoy-tracing/envoy-tracing.yaml"
    expected = deploy.kubernetes_tracing_config("deploy/k8s/base/pointsman.yaml", root=REPO)
    assert (REPO / path).read_text(encoding="utf-8") == expected, (
        "regenerate: .venv/bin/python -m pointsman_devstack.deploy --variant kubernetes-tracing"
    )
    traced, plain = (
        load_yaml(REPO / path),
        load_yaml(REPO / "deploy/k8s/overlays/standalone-envoy/envoy.yaml"),
    )
    (hcm,) = traced["static_resources"]["listeners"][0]["filter_chains"][0]["filters"]
    tracing = hcm["typed_config"].pop("tracing")
    assert tracing["provider"]["name"] == "envoy.tracers.opentelemetry"
    assert tracing["random_sampling"] == {"value": 10.0}
    clusters = traced["static_resources"]["clusters"]
    assert [c["name"] for c in clusters].pop() == envoy.OTLP_CLUSTER
    assert {**traced, "static_resources": {**traced["static_resources"], "clusters": clusters[:-1]}} == plain


def test_the_standalone_bootstrap_verifies_the_picker_certificate() -> None:
    doc = load_yaml(REPO / "deploy/k8s/overlays/standalone-envoy/envoy.yaml")
    (picker,) = [c for c in doc["static_resources"]["clusters"] if c["name"] == envoy.PICKER_CLUSTER]
    tls = picker["transport_socket"]["typed_config"]
    assert tls["sni"] == deploy.KUBERNETES_PICKER
    validation = tls["common_tls_context"]["validation_context"]
    assert validation["trusted_ca"]["filename"] == f"{deploy.KUBERNETES_TLS_DIR}/ca.crt"


# --- Envoy's own answers are JSON, in every bootstrap a client talks to ----------------------------------

# The listeners clients reach (the picker's TLS sidecar only ever answers Envoy's gRPC streams).
CLIENT_FACING = [
    path
    for path in BOOTSTRAPS
    if any(
        f["name"] == "envoy.filters.http.ext_proc"
        for listener in load_yaml(path)["static_resources"]["listeners"]
        for chain in listener["filter_chains"]
        for hcm in chain["filters"]
        for f in hcm["typed_config"].get("http_filters", [])
    )
]


def test_the_client_facing_bootstraps_are_found() -> None:
    names = {p.relative_to(REPO).as_posix() for p in CLIENT_FACING}
    assert names == {
        "deploy/envoy/envoy.yaml",
        "deploy/envoy/envoy-compose.yaml",
        "deploy/envoy/envoy-compose-tracing.yaml",
        "deploy/k8s/overlays/standalone-envoy/envoy.yaml",
        "deploy/k8s/components/standalone-envoy-tracing/envoy-tracing.yaml",
    }


@pytest.mark.parametrize("path", CLIENT_FACING, ids=lambda p: p.relative_to(REPO).as_posix())
def test_envoy_s_local_replies_are_json(path: Path) -> None:
    for listener in load_yaml(path)["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            (hcm,) = chain["filters"]
            assert hcm["typed_config"]["local_reply_config"] == envoy.local_reply_config()


def test_the_picker_s_own_answers_are_what_the_local_replies_pass_through() -> None:
    # The first mapper lets the picker's JSON errors through untouched, by their response details.
    from pointsman_picker.errors import BadRequest, NoCapacity, NoEndpoints
    from pointsman_picker.extproc.responses import error_response

    for error in (BadRequest("not JSON"), NoCapacity("full"), NoEndpoints("no pods")):
        assert error_response(error).immediate_response.details.startswith(envoy.PICKER_DETAILS_PREFIX)


def _patch_policy(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (policy,) = [o for o in objects if o.get("kind") == "EnvoyPatchPolicy"]
    return policy


def _local_reply_patch(policy: dict[str, Any]) -> dict[str, Any]:
    patches = policy["spec"]["jsonPatches"]
    (route,) = [p for p in patches if p["type"].endswith("RouteConfiguration")]
    (listener,) = [p for p in patches if p["type"] == "type.googleapis.com/envoy.config.listener.v3.Listener"]
    # Envoy Gateway names an HTTP listener like its route configuration; the HCM is its default chain's.
    assert listener["name"] == route["name"]
    operation = listener["operation"]
    assert (operation["op"], operation["path"]) == (
        "add",
        "/default_filter_chain/filters/0/typed_config/local_reply_config",
    )
    return dict(operation["value"])


def test_the_envoy_gateway_overlay_patches_in_the_same_local_replies() -> None:
    policy = _patch_policy(load_all_yaml(REPO / "deploy/k8s/overlays/envoy-gateway/policies.yaml"))
    assert _local_reply_patch(policy) == envoy.local_reply_config()


def test_the_helm_chart_s_envoy_gateway_policy_patches_in_the_same_local_replies() -> None:
    from test_deploy_helm import _objects

    assert _local_reply_patch(_patch_policy(_objects("envoy-gateway"))) == envoy.local_reply_config()
