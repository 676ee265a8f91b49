"""Kubernetes discovery against a local HTTP server speaking the API's list/watch protocol.

The server holds an InferencePool and pods shaped like the API server's (see ``data/kubernetes``), lists
them filtered by label selector, and streams watch events as chunked JSON lines, as the API server does.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from collector_process import running_collector

from pointsman_collector.errors import DiscoveryError
from pointsman_collector.kubernetes import (
    Backoff,
    KubeAccess,
    KubernetesTargets,
    PodTable,
    from_kubeconfig,
    in_cluster,
    pool_spec,
    ready_ip,
)
from pointsman_devstack.ports import free_port

DATA = Path(__file__).parent / "data" / "kubernetes"
ALPHA2 = "inference.networking.x-k8s.io/v1alpha2"
V1 = "inference.networking.k8s.io/v1"


def recorded(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text())


def pod(
    name: str, ip: str | None, *, ready: bool = True, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """A pod as the API server returns it, from the recorded one."""
    obj = recorded("pod")
    obj["metadata"]["name"] = name
    obj["metadata"]["labels"] = labels if labels is not None else {"app": "vllm-llama3-8b-instruct"}
    if ip is None:
        del obj["status"]["podIP"]
    else:
        obj["status"]["podIP"] = ip
    for condition in obj["status"]["conditions"]:
        if condition["type"] == "Ready":
            condition["status"] = "True" if ready else "False"
    return obj


# --- the fake API server --------------------------------------------------------------------------


class FakeApi:
    def __init__(self, pool: dict[str, Any]) -> None:
        self.pool: dict[str, Any] | None = pool
        self.pods: dict[str, dict[str, Any]] = {}
        self.version = 100
        self.requests: list[tuple[str, dict[str, str], str]] = []  # path, query, authorization
        self._watchers: dict[str, set[asyncio.Queue[dict[str, Any] | None]]] = {"pods": set(), "pools": set()}
        self._server: asyncio.Server | None = None
        self._watching = {"pods": asyncio.Event(), "pools": asyncio.Event()}

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> FakeApi:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def aclose(self) -> None:
        for queues in self._watchers.values():
            for queue in queues:
                queue.put_nowait(None)
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(asyncio.TimeoutError):
                async with asyncio.timeout(1):
                    await self._server.wait_closed()

    async def watched(self) -> None:
        """Wait until both the pods and the pool are being watched (events sent earlier are lost)."""
        async with asyncio.timeout(5):
            for event in self._watching.values():
                await event.wait()

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        return obj

    def put_pod(self, obj: dict[str, Any], kind: str = "MODIFIED") -> None:
        obj = self._stamp(obj)
        self.pods[obj["metadata"]["name"]] = obj
        self._send("pods", {"type": kind, "object": obj})

    def delete_pod(self, name: str) -> None:
        obj = self._stamp(self.pods.pop(name))
        self._send("pods", {"type": "DELETED", "object": obj})

    def put_pool(self, obj: dict[str, Any]) -> None:
        self.pool = self._stamp(obj)
        self._send("pools", {"type": "MODIFIED", "object": self.pool})

    def delete_pool(self) -> None:
        assert self.pool is not None
        obj, self.pool = self._stamp(self.pool), None
        self._send("pools", {"type": "DELETED", "object": obj})

    def create_pool(self, obj: dict[str, Any]) -> None:
        self.pool = self._stamp(obj)
        self._send("pools", {"type": "ADDED", "object": self.pool})

    def send_raw(self, resource: str, event: dict[str, Any]) -> None:
        """Any event, even one no API server sends."""
        self._send(resource, event)

    def expire(self, resource: str) -> None:
        """The watch's resourceVersion is too old: an ERROR event, as the API server sends for 410."""
        status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410}
        self._send(resource, {"type": "ERROR", "object": status})

    def _send(self, resource: str, event: dict[str, Any]) -> None:
        for queue in self._watchers[resource]:
            queue.put_nowait(event)

    def _selected(self, selector: str) -> list[dict[str, Any]]:
        wanted = dict(part.split("=", 1) for part in selector.split(",") if part)
        return [
            p
            for p in self.pods.values()
            if all(p["metadata"]["labels"].get(k) == v for k, v in wanted.items())
        ]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode().split("\r\n")
                target = lines[0].split(" ")[1]
                headers = {
                    k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:] if ": " in line)
                }
                url = urlsplit(target)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                self.requests.append((url.path, query, headers.get("authorization", "")))
                if query.get("watch") == "1":
                    await self._stream(writer, "pods" if url.path.endswith("/pods") else "pools")
                    return
                status, body = self._answer(url.path, query)
                data = json.dumps(body).encode()
                head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}"
                writer.write(head.encode() + b"\r\n\r\n" + data)
                await writer.drain()
        finally:
            writer.close()

    def _answer(self, path: str, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        if path.endswith("/pods"):
            items = self._selected(query.get("labelSelector", ""))
            return 200, {
                "kind": "PodList",
                "metadata": {"resourceVersion": str(self.version)},
                "items": items,
            }
        if (
            "/inferencepools/" in path
            and self.pool is not None
            and path.endswith(self.pool["metadata"]["name"])
        ):
            return 200, self.pool
        return 404, {"kind": "Status", "code": 404}

    async def _stream(self, writer: asyncio.StreamWriter, resource: str) -> None:
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._watchers[resource].add(queue)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        self._watching[resource].set()
        try:
            while (event := await queue.get()) is not None:
                line = json.dumps(event).encode() + b"\n"
                writer.write(b"%x\r\n%s\r\n" % (len(line), line))
                await writer.drain()
                if event["type"] == "ERROR":
                    break
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            self._watchers[resource].discard(queue)


class Seen:
    """The endpoint sets ``on_change`` was called with, and a way to wait for one."""

    def __init__(self) -> None:
        self.sets: list[tuple[str, ...]] = []
        self._changed = asyncio.Event()

    def __call__(self, endpoints: tuple[str, ...]) -> None:
        self.sets.append(endpoints)
        self._changed.set()

    async def until(self, expected: tuple[str, ...]) -> None:
        async with asyncio.timeout(5):
            while not self.sets or self.sets[-1] != expected:
                self._changed.clear()
                await self._changed.wait()


@pytest.fixture
async def follow() -> AsyncIterator[Any]:
    started: list[tuple[FakeApi, asyncio.Task[None]]] = []

    async def start(
        pool: dict[str, Any], pods: list[dict[str, Any]], api_version: str = ALPHA2
    ) -> tuple[FakeApi, Seen]:
        api = await FakeApi(pool).start()
        for p in pods:
            api.put_pod(p, "ADDED")
        seen = Seen()
        access = KubeAccess(server=api.url, namespace="default", token="t0ken")
        targets = KubernetesTargets(
            access,
            pool=pool["metadata"]["name"],
            api_version=api_version,
            on_change=seen,
            backoff=Backoff(initial=0.01, maximum=0.05),
        )
        started.append((api, asyncio.create_task(targets.run())))
        return api, seen

    yield start
    for api, task in started:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.aclose()


# --- following a pool -----------------------------------------------------------------------------


async def test_ready_pods_join_and_leave_as_they_change(follow) -> None:
    api, seen = await follow(
        recorded("inferencepool-v1alpha2"),
        [
            pod("a", "10.0.0.1"),
            pod("b", "10.0.0.2", ready=False),
            pod("x", "10.0.0.9", labels={"app": "other"}),
        ],
    )
    await seen.until(("10.0.0.1:8000",))
    path, query, auth = api.requests[1]
    assert (path, query["labelSelector"], auth) == (
        "/api/v1/namespaces/default/pods",
        "app=vllm-llama3-8b-instruct",
        "Bearer t0ken",
    )
    await api.watched()
    api.put_pod(pod("b", "10.0.0.2"))  # turned Ready
    await seen.until(("10.0.0.1:8000", "10.0.0.2:8000"))
    api.put_pod(pod("b", "10.0.0.2", ready=False))
    await seen.until(("10.0.0.1:8000",))
    api.put_pod(pod("b", "10.0.0.2"))
    await seen.until(("10.0.0.1:8000", "10.0.0.2:8000"))
    api.put_pod(pod("c", None), "ADDED")  # scheduled, no IP yet
    api.delete_pod("a")
    await seen.until(("10.0.0.2:8000",))
    api.put_pod(pod("b", "10.0.0.2", labels={"app": "elsewhere"}))  # relabelled: no longer in the pool
    await seen.until(())


async def test_a_selector_change_relists_the_pods(follow) -> None:
    pool = recorded("inferencepool-v1alpha2")
    api, seen = await follow(pool, [pod("a", "10.0.0.1"), pod("z", "10.0.0.7", labels={"app": "new"})])
    await seen.until(("10.0.0.1:8000",))
    await api.watched()
    pool["spec"]["selector"] = {"app": "new"}
    pool["spec"]["targetPortNumber"] = 9000
    api.put_pool(pool)
    await seen.until(("10.0.0.7:9000",))
    assert any(q.get("labelSelector") == "app=new" and "watch" not in q for _, q, _ in api.requests)


async def test_an_expired_watch_relists(follow) -> None:
    api, seen = await follow(recorded("inferencepool-v1alpha2"), [pod("a", "10.0.0.1")])
    await seen.until(("10.0.0.1:8000",))
    await api.watched()
    lists = sum("watch" not in q for p, q, _ in api.requests if p.endswith("/pods"))
    api.pods["b"] = pod("b", "10.0.0.2")  # a change the expired watch never delivered
    api.pods["b"]["metadata"]["resourceVersion"] = "1"
    api.expire("pods")
    await seen.until(("10.0.0.1:8000", "10.0.0.2:8000"))
    assert sum("watch" not in q for p, q, _ in api.requests if p.endswith("/pods")) == lists + 1


async def test_an_odd_event_restarts_from_a_fresh_list(follow) -> None:
    api, seen = await follow(recorded("inferencepool-v1alpha2"), [pod("a", "10.0.0.1")])
    await seen.until(("10.0.0.1:8000",))
    await api.watched()
    api.send_raw("pods", {"type": "MODIFIED", "object": ["not", "a", "pod"]})
    api.pods["b"] = pod("b", "10.0.0.2")  # listed on the restart
    api.pods["b"]["metadata"]["resourceVersion"] = "1"
    await seen.until(("10.0.0.1:8000", "10.0.0.2:8000"))


async def test_v1_pools_have_several_target_ports(follow) -> None:
    _, seen = await follow(recorded("inferencepool-v1"), [pod("a", "10.0.0.1")], api_version=V1)
    await seen.until(("10.0.0.1:8000", "10.0.0.1:8001"))


async def test_a_missing_pool_is_retried_until_it_appears(follow) -> None:
    pool = recorded("inferencepool-v1alpha2")
    api, seen = await follow(pool, [pod("a", "10.0.0.1")])
    await seen.until(("10.0.0.1:8000",))
    await api.watched()
    api.delete_pool()
    await seen.until(())
    api.create_pool(pool)  # nobody watches it now: found by the retried GET
    await seen.until(("10.0.0.1:8000",))


# --- reading objects ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "selector", "ports"),
    [
        ({"selector": {"app": "x"}, "targetPortNumber": 8000}, (("app", "x"),), (8000,)),
        (
            {
                "selector": {"matchLabels": {"b": "2", "a": "1"}},
                "targetPorts": [{"number": 1}, {"number": 2}],
            },
            (("a", "1"), ("b", "2")),
            (1, 2),
        ),
    ],
    ids=["v1alpha2", "v1"],
)
def test_pool_spec(
    spec: dict[str, Any], selector: tuple[tuple[str, str], ...], ports: tuple[int, ...]
) -> None:
    got = pool_spec({"spec": spec})
    assert (got.selector, got.ports) == (selector, ports)


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"selector": {}, "targetPortNumber": 8000},
        {"selector": {"app": "x"}},
        {"selector": {"app": "x"}, "targetPortNumber": 0},
        {"selector": {"app": "x"}, "targetPorts": []},
        {
            "selector": {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
            "targetPorts": [{"number": 1}],
        },
    ],
    ids=["empty", "no labels", "no port", "port 0", "no ports", "expressions"],
)
def test_unusable_pools(spec: dict[str, Any]) -> None:
    with pytest.raises(DiscoveryError):
        pool_spec({"spec": spec})


@pytest.mark.parametrize(
    ("obj", "ip"),
    [
        (pod("a", "10.0.0.1"), "10.0.0.1"),
        (pod("a", "10.0.0.1", ready=False), None),
        (pod("a", None), None),
        (
            {**pod("a", "10.0.0.1"), "metadata": {"name": "a", "deletionTimestamp": "2026-11-30T20:00:00Z"}},
            None,
        ),
        ({"metadata": {"name": "a"}, "status": {"podIP": "10.0.0.1"}}, None),
    ],
    ids=["ready", "not ready", "no ip", "terminating", "no conditions"],
)
def test_ready_ip(obj: dict[str, Any], ip: str | None) -> None:
    assert ready_ip(obj) == ip


def test_pod_table_keys_by_name_and_dedups_ips() -> None:
    table = PodTable()
    table.reset([pod("a", "10.0.0.1"), pod("b", "10.0.0.1"), pod("c", "fd00::1")])
    assert table.endpoints((8000,)) == ("10.0.0.1:8000", "[fd00::1]:8000")
    table.apply("DELETED", pod("a", "10.0.0.1"))
    assert table.endpoints((8000,)) == ("10.0.0.1:8000", "[fd00::1]:8000")


# --- access ---------------------------------------------------------------------------------------


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


# --- the whole collector ----------------------------------------------------------------------------


async def test_the_collector_scrapes_the_pools_ready_pods(
    tmp_path: Path, redis_url: str, pod_server, fixture_page
) -> None:  # type: ignore[no-untyped-def]
    model_server = await pod_server(fixture_page("vllm-v0-lora"))
    pool = recorded("inferencepool-v1alpha2")
    pool["spec"]["targetPortNumber"] = model_server.port
    api = await FakeApi(pool).start()
    api.put_pod(pod("a", "127.0.0.1"), "ADDED")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"current-context: local\nclusters:\n- name: c\n  cluster: {{server: '{api.url}'}}\n"
        "users:\n- name: u\n  user: {token: t0ken}\n"
        "contexts:\n- name: local\n  context: {cluster: c, user: u, namespace: default}\n"
    )
    listen = free_port()
    config = tmp_path / "pointsman.yaml"
    config.write_text(
        f"pool:\n  name: {pool['metadata']['name']}\n  kubernetes: {{kubeconfig: '{kubeconfig}'}}\n"
        f"redis:\n  url: {redis_url}\ncollector:\n  listen: 127.0.0.1:{listen}\n"
    )
    try:
        async with (
            running_collector(config) as run,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{listen}") as client,
        ):

            async def pods() -> list[tuple[str, bool]]:
                async with asyncio.timeout(10):
                    while True:
                        with contextlib.suppress(httpx.TransportError):
                            response = await client.get("/v1/pool")
                            if response.status_code == 200:
                                return [(p["address"], p["healthy"]) for p in response.json()["pods"]]
                        await asyncio.sleep(0.05)

            async def until(expected: list[tuple[str, bool]]) -> None:
                async with asyncio.timeout(10):
                    while True:
                        if await pods() == expected:
                            return
                        await asyncio.sleep(0.05)

            await until([(model_server.address, True)])
            await api.watched()
            api.put_pod(pod("a", "127.0.0.1", ready=False))
            await until([])
    finally:
        await api.aclose()
    assert run.process.returncode == 0, run.log
