"""TLS between gateway and picker, for real: the standalone Envoy's bootstrap and the picker pod's TLS
sidecar, run locally in front of the real picker with certificates from picker-tls.sh, route a request;
a gateway trusting another CA does not."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from deploy_kit import REPO, make_picker_tls

from pointsman_devstack import deploy, envoy
from pointsman_devstack.ports import free_port
from pointsman_devstack.process import ManagedProcess
from pointsman_devstack.readiness import Probe, http_ok, wait_ready
from pointsman_devstack.stack import Stack

SIDECAR = REPO / "deploy/k8s/base/picker-tls-proxy.yaml"
GATEWAY = REPO / "deploy/k8s/overlays/standalone-envoy/envoy.yaml"
REQUEST = {"model": "tweet-summary", "prompt": "hello", "max_tokens": 4}


def _socket(address: dict[str, Any], host: str, port: int) -> None:
    address["socket_address"] = {"address": host, "port_value": port}


def _endpoint(cluster: dict[str, Any]) -> dict[str, Any]:
    (group,) = cluster["load_assignment"]["endpoints"]
    (endpoint,) = group["lb_endpoints"]
    address: dict[str, Any] = endpoint["endpoint"]["address"]
    return address


def _localized(path: Path, tls_dir: Path) -> dict[str, Any]:
    """A bootstrap with the pod's certificate mount replaced by ``tls_dir``."""
    text = path.read_text(encoding="utf-8").replace(deploy.KUBERNETES_TLS_DIR, str(tls_dir))
    doc: dict[str, Any] = yaml.safe_load(text)
    return doc


class Proxies:
    """The sidecar in front of the stack's picker, and gateways (standalone bootstrap) in front of it."""

    def __init__(self, stack: Stack, tls_dir: Path, run_dir: Path) -> None:
        self.stack = stack
        self.run_dir = run_dir
        self.sidecar_port = free_port()
        sidecar = _localized(SIDECAR, tls_dir)
        (listener,) = sidecar["static_resources"]["listeners"]
        _socket(listener["address"], "127.0.0.1", self.sidecar_port)
        (cluster,) = sidecar["static_resources"]["clusters"]
        _socket(_endpoint(cluster), "127.0.0.1", stack.ports.picker)
        self.processes = [self._start("sidecar", sidecar)]

    def gateway(self, name: str, tls_dir: Path) -> str:
        """Start a gateway trusting ``tls_dir``/ca.crt; return its URL once its admin is ready."""
        port, admin = free_port(), free_port()
        doc = _localized(GATEWAY, tls_dir)
        _socket(doc["admin"]["address"], "127.0.0.1", admin)
        (listener,) = doc["static_resources"]["listeners"]
        _socket(listener["address"], "127.0.0.1", port)
        (picker,) = [c for c in doc["static_resources"]["clusters"] if c["name"] == envoy.PICKER_CLUSTER]
        # Dial the sidecar here; the SNI and the name checked in its certificate stay the Service's.
        _socket(_endpoint(picker), "127.0.0.1", self.sidecar_port)
        process = self._start(name, doc)
        self.processes.append(process)
        with httpx.Client(timeout=5.0) as client:
            wait_ready(process, http_ok(client, f"http://127.0.0.1:{admin}/ready"), timeout=30, what="ready")
        return f"http://127.0.0.1:{port}"

    def _start(self, name: str, doc: dict[str, Any]) -> ManagedProcess:
        path = self.run_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        argv = [envoy.find_envoy(), "-c", str(path), "--log-level", "warn", "--disable-hot-restart"]
        return ManagedProcess(name, argv, env=os.environ, log_path=self.run_dir / f"{name}.log")

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop(grace=5.0)


def _routed(client: httpx.Client, url: str) -> Probe:
    """The gateway routes a request; until its health checks reach the picker it answers 503."""

    def probe() -> str | None:
        response = client.post(f"{url}/v1/completions", json=REQUEST)
        return None if response.status_code == 200 else f"HTTP {response.status_code}: {response.text[:200]}"

    return probe


@pytest.fixture
def proxies(stack: Stack, picker_tls: Path, tmp_path: Path) -> Iterator[Proxies]:
    running = Proxies(stack, picker_tls, tmp_path)
    try:
        yield running
    finally:
        running.stop()


def test_a_gateway_trusting_the_ca_routes_through_the_sidecar(proxies: Proxies, picker_tls: Path) -> None:
    url = proxies.gateway("gateway", picker_tls)
    with httpx.Client(timeout=30.0) as client:
        wait_ready(proxies.processes[-1], _routed(client, url), timeout=30, what="a routed request")
        response = client.post(f"{url}/v1/completions", json=REQUEST)
    assert response.status_code == 200
    assert response.headers["x-pointsman-pod"]


def test_a_gateway_trusting_another_ca_gets_no_picker(proxies: Proxies, tmp_path: Path) -> None:
    stranger = make_picker_tls(tmp_path / "other-ca")
    url = proxies.gateway("stranger", stranger)
    with httpx.Client(timeout=30.0) as client:
        response = client.post(f"{url}/v1/completions", json=REQUEST)
    # The picker is unreachable over an unverified connection: ext_proc fails closed.
    assert response.status_code == 503
