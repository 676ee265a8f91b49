"""Pods from Kubernetes: the InferencePool named in the config, and the Ready pods its selector matches.

Both are followed with the API's list/watch protocol over httpx (speed does not matter here: a few
requests a minute). A pod counts while it is Ready and has an IP, at ``podIP:port`` for each of the
pool's target ports (``targetPortNumber`` in ``inference.networking.x-k8s.io/v1alpha2``, ``targetPorts[]``
in ``inference.networking.k8s.io/v1``). A change of the pool's selector or ports re-lists the pods; a
watch that expired (410 Gone) re-lists; a failure backs off and starts over from a fresh list, keeping
the last known pods meanwhile. Access is the in-cluster service account or a kubeconfig.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from pointsman_collector.errors import DiscoveryError
from pointsman_shared.config import join_host_port

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# The API server ends a watch after this long; it is then resumed from the last resourceVersion.
WATCH_SECONDS = 300


# --- reading objects (pure) ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PoolSpec:
    selector: tuple[tuple[str, str], ...]  # matchLabels, sorted
    ports: tuple[int, ...]

    @property
    def label_selector(self) -> str:
        return ",".join(f"{key}={value}" for key, value in self.selector)


def pool_spec(pool: Mapping[str, Any]) -> PoolSpec:
    """The selector and ports of an InferencePool of either API version; raise :class:`DiscoveryError`."""
    spec = pool.get("spec")
    if not isinstance(spec, dict):
        raise DiscoveryError("kubernetes", "InferencePool has no spec")
    selector = spec.get("selector")
    if isinstance(selector, dict) and ("matchLabels" in selector or "matchExpressions" in selector):
        if selector.get("matchExpressions"):
            raise DiscoveryError("kubernetes", "InferencePool selector.matchExpressions is not supported")
        selector = selector.get("matchLabels")  # v1: a LabelSelector
    if not isinstance(selector, dict) or not selector:
        raise DiscoveryError("kubernetes", "InferencePool has no selector labels")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in selector.items()):
        raise DiscoveryError("kubernetes", "InferencePool selector labels must be strings")
    if "targetPorts" in spec:
        raw_ports = [p.get("number") if isinstance(p, dict) else None for p in spec["targetPorts"] or []]
    else:
        raw_ports = [spec.get("targetPortNumber")]
    ports: list[int] = []
    for port in raw_ports:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise DiscoveryError("kubernetes", f"InferencePool target port {port!r} is not a port")
        if port not in ports:
            ports.append(port)
    if not ports:
        raise DiscoveryError("kubernetes", "InferencePool has no target port")
    return PoolSpec(tuple(sorted(selector.items())), tuple(ports))


def ready_ip(pod: Mapping[str, Any]) -> str | None:
    """The pod's IP while it is Ready and not being deleted, else ``None``."""
    metadata = pod.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        return None
    status = pod.get("status") or {}
    ip = status.get("podIP")
    if not isinstance(ip, str) or not ip:
        return None
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Ready":
            return ip if condition.get("status") == "True" else None
    return None


class PodTable:
    """The Ready pods seen so far, by name, from a list and the watch events after it.

    A pod whose labels stop matching the selector leaves, whether the API server says so with a
    DELETED event (as a label-selector watch does) or sends the modified pod.
    """

    def __init__(self, selector: tuple[tuple[str, str], ...] = ()) -> None:
        self._selector = selector
        self._ips: dict[str, str] = {}

    def reset(
        self, pods: list[Mapping[str, Any]], selector: tuple[tuple[str, str], ...] | None = None
    ) -> None:
        if selector is not None:
            self._selector = selector
        self._ips.clear()
        for pod in pods:
            self.apply("ADDED", pod)

    def apply(self, kind: str, pod: Mapping[str, Any]) -> None:
        metadata = pod.get("metadata") or {}
        name = str(metadata.get("name", ""))
        labels = metadata.get("labels") or {}
        matches = all(labels.get(key) == value for key, value in self._selector)
        ip = None if kind == "DELETED" or not matches else ready_ip(pod)
        if ip is None:
            self._ips.pop(name, None)
        else:
            self._ips[name] = ip

    def endpoints(self, ports: tuple[int, ...]) -> tuple[str, ...]:
        return tuple(sorted(join_host_port(ip, port) for ip in set(self._ips.values()) for port in ports))


# --- access --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KubeAccess:
    """How to reach the API server: its URL, credentials and the namespace to look in."""

    server: str
    namespace: str
    verify: ssl.SSLContext | bool = True
    token: str | None = None
    token_file: Path | None = None  # re-read on each request: service-account tokens rotate
    cert: tuple[str, str] | None = None

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.server,
            verify=self.verify,
            cert=self.cert,
            auth=_BearerToken(self.token, self.token_file),
            timeout=httpx.Timeout(10.0, read=WATCH_SECONDS + 30.0),
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


# --- following the pool -------------------------------------------------------------------------


class _Relist(Exception):
    """The watch cannot resume (410 Gone, or an ERROR event): list again."""


class _SpecChanged(Exception):
    """The pool's selector or ports changed (``spec``), or the pool was deleted (``spec`` is None)."""

    def __init__(self, spec: PoolSpec | None, version: str) -> None:
        self.spec = spec
        self.version = version


@dataclass(frozen=True, slots=True)
class Backoff:
    initial: float = 0.5
    maximum: float = 10.0


class KubernetesTargets:
    """Follows an InferencePool and its pods; calls ``on_change`` with the endpoints whenever they change."""

    def __init__(
        self,
        access: KubeAccess,
        *,
        pool: str,
        api_version: str,
        on_change: Callable[[tuple[str, ...]], None],
        backoff: Backoff = Backoff(),
        watch_seconds: int = WATCH_SECONDS,
    ) -> None:
        self._access = access
        self._pool = pool
        self._pools_path = f"/apis/{api_version}/namespaces/{access.namespace}/inferencepools"
        self._pods_path = f"/api/v1/namespaces/{access.namespace}/pods"
        self._on_change = on_change
        self._backoff = backoff
        self._watch_seconds = watch_seconds
        self._table = PodTable()
        self.endpoints: tuple[str, ...] = ()
        self.synced = asyncio.Event()  # set once the pods have been listed

    async def run(self) -> None:
        """Follow the pool until cancelled; failures are logged and retried with backoff."""
        delay = self._backoff.initial
        last_error = ""
        async with self._access.client() as client:
            while True:
                try:
                    await self._session(client)
                except Exception as exc:  # an API failure, an odd object, or a bug: never stop for good
                    message = f"{type(exc).__name__}: {exc}"
                    if message != last_error:
                        expected = isinstance(exc, DiscoveryError | httpx.HTTPError | ValueError | KeyError)
                        log.warning(
                            "kubernetes discovery: %s; retrying (keeping %d pods)",
                            message,
                            len(self.endpoints),
                            exc_info=None if expected else exc,
                        )
                    last_error = message
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self._backoff.maximum)
                else:
                    delay = self._backoff.initial

    async def _session(self, client: httpx.AsyncClient) -> None:
        pool = await self._get(client, f"{self._pools_path}/{self._pool}")
        spec = pool_spec(pool)
        version = pool["metadata"]["resourceVersion"]
        while True:
            pods = asyncio.create_task(self._follow_pods(client, spec))
            watch = asyncio.create_task(self._watch_pool(client, spec, version))
            try:
                done, _ = await asyncio.wait({pods, watch}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (pods, watch):
                    task.cancel()
                await asyncio.gather(pods, watch, return_exceptions=True)
            finished = done.pop()
            exc = finished.exception()
            if isinstance(exc, _SpecChanged) and exc.spec is not None:
                log.info("InferencePool %s changed: re-listing its pods", self._pool)
                spec, version = exc.spec, exc.version
                continue
            if isinstance(exc, _SpecChanged):  # the pool was deleted
                self._table.reset([])
                self._emit(spec)
                raise DiscoveryError("kubernetes", f"InferencePool {self._pool} was deleted")
            if exc is not None:
                raise exc
            return  # the pool's watch restarts the session (410): GET the pool again

    async def _watch_pool(self, client: httpx.AsyncClient, spec: PoolSpec, version: str) -> str:
        params = {"fieldSelector": f"metadata.name={self._pool}"}
        while True:
            try:
                async for kind, obj in self._watch(client, self._pools_path, params, version):
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if kind == "DELETED":
                        raise _SpecChanged(None, version)
                    if kind in ("ADDED", "MODIFIED") and (new := pool_spec(obj)) != spec:
                        raise _SpecChanged(new, version)
            except _Relist:
                return version

    async def _follow_pods(self, client: httpx.AsyncClient, spec: PoolSpec) -> None:
        params = {"labelSelector": spec.label_selector}
        while True:
            listed = await self._get(client, self._pods_path, params)
            self._table.reset(listed.get("items") or [], spec.selector)
            self._emit(spec)
            self.synced.set()
            version = listed["metadata"]["resourceVersion"]
            try:
                while True:
                    async for kind, pod in self._watch(client, self._pods_path, params, version):
                        version = pod.get("metadata", {}).get("resourceVersion", version)
                        if kind != "BOOKMARK":
                            self._table.apply(kind, pod)
                            self._emit(spec)
            except _Relist:
                continue

    def _emit(self, spec: PoolSpec) -> None:
        endpoints = self._table.endpoints(spec.ports)
        if endpoints != self.endpoints:
            log.info("kubernetes discovery: %d ready pods", len(endpoints))
            self.endpoints = endpoints
            self._on_change(endpoints)

    async def _get(
        self, client: httpx.AsyncClient, path: str, params: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        response = await client.get(path, params=params)
        if response.status_code != 200:
            raise DiscoveryError("kubernetes", f"GET {path}: HTTP {response.status_code}")
        doc = response.json()
        if not isinstance(doc, dict):
            raise DiscoveryError("kubernetes", f"GET {path}: not an object")
        return doc

    async def _watch(
        self, client: httpx.AsyncClient, path: str, params: Mapping[str, str], version: str
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """The events of one watch request, until the server ends it. Raises :class:`_Relist`."""
        query = {
            **params,
            "watch": "1",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self._watch_seconds),
        }
        async with client.stream("GET", path, params=query) as response:
            if response.status_code == 410:
                raise _Relist
            if response.status_code != 200:
                raise DiscoveryError("kubernetes", f"watch {path}: HTTP {response.status_code}")
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    # Usually 410 Gone: the resourceVersion is too old to resume from.
                    raise _Relist
                yield str(kind), obj
