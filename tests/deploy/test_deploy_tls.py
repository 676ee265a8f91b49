"""TLS between gateway and picker, for real: the standalone Envoy's bootstrap and the picker pod's TLS
sidecar, run locally in front of the real picker with certificates from picker-tls.sh. A gateway trusting
the CA routes a request, one trusting another CA does not; a renewed certificate swapped into the
Secret's mount the way the kubelet does it is served without a restart; with mTLS
(components/picker-mtls) only a gateway presenting a client certificate from the CA gets through."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from deploy_kit import REPO, make_picker_tls
from test_deploy_k8s import _build_kustomization

from pointsman_devstack import deploy, envoy
from pointsman_devstack.ports import free_port
from pointsman_devstack.process import ManagedProcess
from pointsman_devstack.readiness import Probe, http_ok, wait_ready
from pointsman_devstack.stack import Stack

SIDECAR = REPO / "deploy/k8s/base/picker-tls-proxy.yaml"
MTLS_SIDECAR = REPO / "deploy/k8s/components/picker-mtls/picker-tls-proxy.yaml"
GATEWAY = REPO / "deploy/k8s/overlays/standalone-envoy/envoy.yaml"
# Where the sidecar's ConfigMap (its bootstrap and the SDS files beside it) is mounted in the pod.
SIDECAR_CONFIG_DIR = "/etc/envoy"
REQUEST = {"model": "tweet-summary", "prompt": "hello", "max_tokens": 4}


def localized(path: Path, tls_dir: Path, run_dir: Path) -> Path:
    """``path``, a bootstrap, written into ``run_dir`` with the pod's mounts replaced: the TLS Secret's
    by ``tls_dir``, the sidecar's ConfigMap by a directory of ``run_dir`` holding the SDS files it names
    (found beside ``path``, else in the base, as the mTLS component's ConfigMap merges them)."""
    config_dir = run_dir / f"{path.stem}-config"
    config_dir.mkdir(parents=True, exist_ok=True)

    def local(text: str) -> str:
        text = text.replace(deploy.KUBERNETES_TLS_DIR, str(tls_dir))
        return text.replace(f"{SIDECAR_CONFIG_DIR}/", f"{config_dir}/").replace(
            f"{{path: {SIDECAR_CONFIG_DIR}}}", f"{{path: {config_dir}}}"
        )

    text = path.read_text(encoding="utf-8")
    for line in text.splitlines():
        if f"path: {SIDECAR_CONFIG_DIR}/" in line:
            name = line.split(f"{SIDECAR_CONFIG_DIR}/", 1)[1].strip()
            source = next(p for p in (path.with_name(name), SIDECAR.with_name(name)) if p.is_file())
            (config_dir / name).write_text(local(source.read_text(encoding="utf-8")), encoding="utf-8")
    out = run_dir / path.name
    out.write_text(local(text), encoding="utf-8")
    return out


def _socket(address: dict[str, Any], host: str, port: int) -> None:
    address["socket_address"] = {"address": host, "port_value": port}


def _endpoint(cluster: dict[str, Any]) -> dict[str, Any]:
    (group,) = cluster["load_assignment"]["endpoints"]
    (endpoint,) = group["lb_endpoints"]
    address: dict[str, Any] = endpoint["endpoint"]["address"]
    return address


def _load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return doc


def _picker_tls_context(doc: dict[str, Any]) -> dict[str, Any]:
    (picker,) = [c for c in doc["static_resources"]["clusters"] if c["name"] == envoy.PICKER_CLUSTER]
    context: dict[str, Any] = picker["transport_socket"]["typed_config"]["common_tls_context"]
    return context


class Proxies:
    """The sidecar in front of the stack's picker, and gateways (standalone bootstrap) in front of it."""

    def __init__(self, stack: Stack, tls_dir: Path, run_dir: Path, *, sidecar: Path = SIDECAR) -> None:
        self.stack = stack
        self.run_dir = run_dir
        self.sidecar_port = free_port()
        doc = _load(localized(sidecar, tls_dir, run_dir / "sidecar"))
        (listener,) = doc["static_resources"]["listeners"]
        _socket(listener["address"], "127.0.0.1", self.sidecar_port)
        (cluster,) = doc["static_resources"]["clusters"]
        _socket(_endpoint(cluster), "127.0.0.1", stack.ports.picker)
        self.processes: list[ManagedProcess] = []
        self.sidecar = self._start("sidecar", doc)

    def gateway(self, name: str, tls_dir: Path, *, client_certificate: bool = True) -> str:
        """Start a gateway trusting ``tls_dir``/ca.crt and presenting ``tls_dir``/gateway.crt (or no
        client certificate); return its URL once its admin is ready."""
        port, admin = free_port(), free_port()
        doc = _load(localized(GATEWAY, tls_dir, self.run_dir / name))
        _socket(doc["admin"]["address"], "127.0.0.1", admin)
        (listener,) = doc["static_resources"]["listeners"]
        _socket(listener["address"], "127.0.0.1", port)
        (picker,) = [c for c in doc["static_resources"]["clusters"] if c["name"] == envoy.PICKER_CLUSTER]
        # Dial the sidecar here; the SNI and the name checked in its certificate stay the Service's.
        _socket(_endpoint(picker), "127.0.0.1", self.sidecar_port)
        if not client_certificate:
            del _picker_tls_context(doc)["tls_certificates"]
        process = self._start(name, doc)
        with httpx.Client(timeout=5.0) as client:
            wait_ready(process, http_ok(client, f"http://127.0.0.1:{admin}/ready"), timeout=30, what="ready")
        return f"http://127.0.0.1:{port}"

    def _start(self, name: str, doc: dict[str, Any]) -> ManagedProcess:
        path = self.run_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        argv = [envoy.find_envoy(), "-c", str(path), "--log-level", "warn", "--disable-hot-restart"]
        process = ManagedProcess(name, argv, env=os.environ, log_path=self.run_dir / f"{name}.log")
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop(grace=5.0)


def _routed(client: httpx.Client, url: str) -> Probe:
    """The gateway routes a request; until its health checks reach the picker it answers 503."""

    def probe() -> str | None:
        response = client.post(f"{url}/v1/completions", json=REQUEST)
        return None if response.status_code == 200 else f"HTTP {response.status_code}: {response.text[:200]}"

    return probe


def _route(proxies: Proxies, url: str) -> httpx.Response:
    with httpx.Client(timeout=30.0) as client:
        wait_ready(proxies.processes[-1], _routed(client, url), timeout=30, what="a routed request")
        return client.post(f"{url}/v1/completions", json=REQUEST)


@pytest.fixture
def proxies(stack: Stack, picker_tls: Path, tmp_path: Path) -> Iterator[Proxies]:
    running = Proxies(stack, picker_tls, tmp_path)
    try:
        yield running
    finally:
        running.stop()


def test_a_gateway_trusting_the_ca_routes_through_the_sidecar(proxies: Proxies, picker_tls: Path) -> None:
    url = proxies.gateway("gateway", picker_tls)
    response = _route(proxies, url)
    assert response.status_code == 200
    assert response.headers["x-pointsman-pod"]


def test_a_gateway_trusting_another_ca_gets_no_picker(proxies: Proxies, tmp_path: Path) -> None:
    stranger = make_picker_tls(tmp_path / "other-ca")
    url = proxies.gateway("stranger", stranger)
    with httpx.Client(timeout=30.0) as client:
        response = client.post(f"{url}/v1/completions", json=REQUEST)
    # The picker is unreachable over an unverified connection: ext_proc fails closed.
    assert response.status_code == 503


# --- certificate renewal without a restart ----------------------------------------------------------------


class SecretMount:
    """A directory laid out as the kubelet lays out a Secret's volume: the files are links into
    ``..data``, itself a link to a timestamped directory; an update writes a new directory and renames a
    new link over ``..data`` (one atomic step, as the kubelet's AtomicWriter does)."""

    FILES = ("ca.crt", "tls.crt", "tls.key")

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True)
        self._versions = 0

    def publish(self, source: Path) -> None:
        self._versions += 1
        version = self.path / f"..{self._versions:04d}"
        version.mkdir()
        for name in self.FILES:
            shutil.copy(source / name, version / name)
        staged = self.path / "..data_tmp"
        staged.symlink_to(version.name)
        staged.rename(self.path / "..data")
        for name in self.FILES:
            link = self.path / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")


def renewed(ca: Path, directory: Path) -> Path:
    """New certificates from the same CA: picker-tls.sh run again where the CA's key is."""
    directory.mkdir(parents=True)
    for name in ("ca.crt", "ca.key"):
        shutil.copy(ca / name, directory / name)
    subprocess.run([str(REPO / "deploy/k8s/picker-tls.sh"), str(directory)], check=True, capture_output=True)
    return directory


def served_certificate(port: int, ca: Path, client: Path | None = None) -> bytes:
    """The certificate (DER) the sidecar on ``port`` serves a new connection, verified against ``ca``
    for the picker Service's name; with ``client``, presenting its gateway.crt."""
    context = ssl.create_default_context(cafile=ca / "ca.crt")
    context.set_alpn_protocols(["h2"])
    if client is not None:
        context.load_cert_chain(client / "gateway.crt", client / "gateway.key")
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=deploy.KUBERNETES_PICKER) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        # TLS 1.3: a refused client certificate shows on the first read, after the handshake.
        tls.settimeout(0.5)
        with contextlib.suppress(TimeoutError):
            tls.recv(1)
    assert der is not None
    return der


def _der(certificate: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(certificate.read_text(encoding="ascii"))


def test_a_renewed_certificate_is_served_without_a_restart(
    stack: Stack, picker_tls: Path, tmp_path: Path
) -> None:
    mount = SecretMount(tmp_path / "mount")
    mount.publish(picker_tls)
    proxies = Proxies(stack, mount.path, tmp_path)
    try:
        url = proxies.gateway("gateway", picker_tls)
        assert _route(proxies, url).status_code == 200
        assert served_certificate(proxies.sidecar_port, picker_tls) == _der(picker_tls / "tls.crt")
        fresh = renewed(picker_tls, tmp_path / "renewed")
        assert _der(fresh / "tls.crt") != _der(picker_tls / "tls.crt")
        mount.publish(fresh)
        deadline = time.monotonic() + 10
        while served_certificate(proxies.sidecar_port, picker_tls) != _der(fresh / "tls.crt"):
            assert time.monotonic() < deadline, "the sidecar still serves the old certificate after 10 s"
            time.sleep(0.1)
        assert proxies.sidecar.returncode is None  # the same process, never restarted
        # The gateway, which trusts the CA, not the certificate, goes on routing.
        with httpx.Client(timeout=30.0) as client:
            assert client.post(f"{url}/v1/completions", json=REQUEST).status_code == 200
    finally:
        proxies.stop()


# --- mTLS -------------------------------------------------------------------------------------------------


@pytest.fixture
def mtls(stack: Stack, picker_tls: Path, tmp_path: Path) -> Iterator[Proxies]:
    running = Proxies(stack, picker_tls, tmp_path, sidecar=MTLS_SIDECAR)
    try:
        yield running
    finally:
        running.stop()


def test_with_mtls_a_gateway_presenting_the_ca_s_client_certificate_routes(
    mtls: Proxies, picker_tls: Path
) -> None:
    url = mtls.gateway("gateway", picker_tls)
    assert _route(mtls, url).status_code == 200
    assert served_certificate(mtls.sidecar_port, picker_tls, client=picker_tls) == _der(
        picker_tls / "tls.crt"
    )


def test_with_mtls_a_gateway_without_the_ca_s_client_certificate_gets_no_picker(
    mtls: Proxies, picker_tls: Path, tmp_path: Path
) -> None:
    # Trusting the right CA, but presenting no client certificate, or one from another CA.
    stranger = make_picker_tls(tmp_path / "other-ca")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(picker_tls / "ca.crt", mixed / "ca.crt")
    for name in ("gateway.crt", "gateway.key"):
        shutil.copy(stranger / name, mixed / name)
    urls = [mtls.gateway("anonymous", picker_tls, client_certificate=False), mtls.gateway("impostor", mixed)]
    with httpx.Client(timeout=30.0) as client:
        for url in urls:
            assert client.post(f"{url}/v1/completions", json=REQUEST).status_code == 503
    for client_dir in (None, stranger):
        with pytest.raises(ssl.SSLError):
            served_certificate(mtls.sidecar_port, picker_tls, client=client_dir)


def test_the_mtls_sidecar_is_the_base_one_requiring_a_client_certificate() -> None:
    base, mtls = _load(SIDECAR), _load(MTLS_SIDECAR)
    (listener,) = mtls["static_resources"]["listeners"]
    tls = listener["filter_chains"][0]["transport_socket"]["typed_config"]
    assert tls.pop("require_client_certificate") is True
    sds = tls["common_tls_context"].pop("validation_context_sds_secret_config")
    assert mtls == base  # nothing else differs
    source = sds["sds_config"]["path_config_source"]
    assert Path(source["path"]).parent.as_posix() == source["watched_directory"]["path"] == SIDECAR_CONFIG_DIR
    (secret,) = _load(MTLS_SIDECAR.with_name(Path(source["path"]).name))["resources"]
    assert secret["name"] == sds["name"]
    validation = secret["validation_context"]
    assert validation["trusted_ca"]["filename"] == f"{deploy.KUBERNETES_TLS_DIR}/ca.crt"
    assert validation["watched_directory"]["path"] == deploy.KUBERNETES_TLS_DIR
    # The name picker-tls.sh gives the gateway's client certificate.
    assert validation["match_typed_subject_alt_names"] == [
        {"san_type": "DNS", "matcher": {"exact": "pointsman-gateway"}}
    ]


def test_the_mtls_component_replaces_the_sidecar_s_bootstrap_and_adds_the_client_ca() -> None:
    objects = _build_kustomization(
        {"resources": ["overlays/sim"], "components": ["components/picker-mtls"]},
        Path(sys.executable).parent / "kubectl",
    )
    (config_map,) = [
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("pointsman-picker-tls-proxy")
    ]
    data = config_map["data"]
    assert sorted(data) == ["envoy.yaml", "gateway-ca.yaml", "picker-certificate.yaml"]
    assert yaml.safe_load(data["envoy.yaml"]) == _load(MTLS_SIDECAR)
    assert data["picker-certificate.yaml"] == SIDECAR.with_name("picker-certificate.yaml").read_text()
    (picker,) = [
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "pointsman-picker"
    ]
    volumes = {v["name"]: v for v in picker["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls-proxy"]["configMap"]["name"] == config_map["metadata"]["name"]
