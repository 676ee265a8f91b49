"""How to reach the API server: the in-cluster service account, or the current context of a kubeconfig."""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from pointsman_collector.errors import DiscoveryError
from pointsman_shared.config import join_host_port

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class KubeAccess:
    """How to reach the API server: its URL, credentials and the namespace to look in."""

    server: str
    namespace: str
    verify: ssl.SSLContext | bool = True
    token: str | None = None
    token_file: Path | None = None  # re-read on each request: service-account tokens rotate
    cert: tuple[str, str] | None = None

    def client(self, *, read_timeout: float) -> httpx.AsyncClient:
        """An API client; ``read_timeout`` must outlast a watch, which sends nothing while nothing changes."""
        return httpx.AsyncClient(
            base_url=self.server,
            verify=self.verify,
            cert=self.cert,
            auth=_BearerToken(self.token, self.token_file),
            timeout=httpx.Timeout(10.0, read=read_timeout),
        )


class _BearerToken(httpx.Auth):
    def __init__(self, token: str | None, token_file: Path | None) -> None:
        self._token = token
        self._file = token_file

    def auth_flow(self, request: httpx.Request) -> Any:
        token = self._file.read_text().strip() if self._file is not None else self._token
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        yield request


def in_cluster(environ: Mapping[str, str], root: Path = SERVICE_ACCOUNT) -> KubeAccess:
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise DiscoveryError("kubernetes", "not in a cluster (KUBERNETES_SERVICE_HOST is not set)")
    try:
        namespace = (root / "namespace").read_text().strip()
        context = ssl.create_default_context(cafile=str(root / "ca.crt"))
    except OSError as exc:
        raise DiscoveryError("kubernetes", f"service account: {exc}") from None
    return KubeAccess(
        server=f"https://{join_host_port(host, int(port))}",
        namespace=namespace,
        verify=context,
        token_file=root / "token",
    )


def from_kubeconfig(path: str | Path, *, namespace: str | None = None) -> KubeAccess:
    """The current context of a kubeconfig: token or client certificate, CA file or data."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
        contexts = {c["name"]: c["context"] for c in doc.get("contexts") or []}
        context = contexts[doc["current-context"]]
        cluster = {c["name"]: c["cluster"] for c in doc.get("clusters") or []}[context["cluster"]]
        user = {u["name"]: u["user"] for u in doc.get("users") or []}.get(context.get("user"), {}) or {}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise DiscoveryError(
            "kubernetes", f"kubeconfig {path}: cannot read the current context ({exc})"
        ) from None
    base = Path(path).parent
    verify: ssl.SSLContext | bool = True
    if cluster.get("insecure-skip-tls-verify"):
        verify = False
    elif "certificate-authority-data" in cluster:
        verify = ssl.create_default_context(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
        )
    elif "certificate-authority" in cluster:
        verify = ssl.create_default_context(cafile=str(base / cluster["certificate-authority"]))
    cert: tuple[str, str] | None = None
    if "client-certificate-data" in user and "client-key-data" in user:
        cert = (_data_file(user["client-certificate-data"]), _data_file(user["client-key-data"]))
    elif "client-certificate" in user and "client-key" in user:
        cert = (str(base / user["client-certificate"]), str(base / user["client-key"]))
    token_file = user.get("tokenFile")
    return KubeAccess(
        server=str(cluster["server"]).rstrip("/"),
        namespace=namespace or context.get("namespace") or "default",
        verify=verify,
        token=user.get("token"),
        token_file=base / token_file if token_file else None,
        cert=cert,
    )


def _data_file(data: str) -> str:
    # ssl loads client certificates only from files.
    handle, name = tempfile.mkstemp(prefix="pointsman-kube-")
    with os.fdopen(handle, "wb") as out:
        out.write(base64.b64decode(data))
    return name
