"""Reaching the API server: kubeconfig and in-cluster access (``kubernetes/credentials.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pointsman_collector.errors import DiscoveryError
from pointsman_collector.kubernetes.credentials import from_kubeconfig, in_cluster


def test_kubeconfig_current_context(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-file\n")
    path = tmp_path / "config"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: dev\n"
        "clusters:\n- name: c\n"
        "  cluster: {server: 'https://10.1.0.1:6443/', insecure-skip-tls-verify: true}\n"
        "users:\n- name: u\n  user: {tokenFile: token}\n"
        "contexts:\n- name: dev\n  context: {cluster: c, user: u, namespace: models}\n"
        "- name: other\n  context: {cluster: c, user: u}\n"
    )
    access = from_kubeconfig(path)
    assert (access.server, access.namespace, access.verify) == ("https://10.1.0.1:6443", "models", False)
    assert access.token_file == tmp_path / "token"
    assert from_kubeconfig(path, namespace="x").namespace == "x"


def test_a_broken_kubeconfig_is_a_discovery_error(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text("current-context: nowhere\ncontexts: []\n")
    with pytest.raises(DiscoveryError, match="current context"):
        from_kubeconfig(path)


def test_in_cluster_needs_the_service_environment(tmp_path: Path) -> None:
    with pytest.raises(DiscoveryError, match="not in a cluster"):
        in_cluster({}, tmp_path)
    (tmp_path / "namespace").write_text("models\n")
    with pytest.raises(DiscoveryError, match="service account"):  # no ca.crt
        in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}, tmp_path)
