"""A local HTTP server speaking the Kubernetes API's list/watch protocol, and objects shaped like its own.

The server holds an InferencePool and pods shaped like the API server's (see ``data/kubernetes``), lists
them filtered by label selector, and streams watch events as chunked JSON lines, as the API server does.
It serves the pool only under its own group and version (``/apis/GROUP/VERSION/namespaces/NS/
inferencepools[/NAME]``), as a cluster with only that CRD version would: any other path is a 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

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


def not_found(message: str = "the server could not find the requested resource") -> dict[str, Any]:
    """The Status object the API server answers a 404 with."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "NotFound",
        "details": {},
        "code": 404,
    }


class FakeApi:
    def __init__(self, pool: dict[str, Any], namespace: str = "default") -> None:
        self.pool: dict[str, Any] | None = pool
        self.pools_path = f"/apis/{pool['apiVersion']}/namespaces/{namespace}/inferencepools"
        self.pods_path = f"/api/v1/namespaces/{namespace}/pods"
        self._pool_name = pool["metadata"]["name"]
        self.pods: dict[str, dict[str, Any]] = {}
        self.version = 100
        self.requests: list[tuple[str, dict[str, str], str]] = []  # path, query, authorization
        self._watchers: dict[str, set[asyncio.Queue[dict[str, Any] | None]]] = {"pods": set(), "pools": set()}
        self._server: asyncio.Server | None = None
        self._watching = {"pods": asyncio.Event(), "pools": asyncio.Event()}
        self._requested = asyncio.Event()

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

    async def requested(self, wanted: Callable[[str, dict[str, str]], bool], count: int = 1) -> None:
        """Wait until ``count`` requests (path, query) are ``wanted``."""
        async with asyncio.timeout(5):
            while sum(wanted(path, query) for path, query, _ in self.requests) < count:
                self._requested.clear()
                await self._requested.wait()

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
                self._requested.set()
                watched = {self.pods_path: "pods", self.pools_path: "pools"}.get(url.path)
                if query.get("watch") == "1" and watched is not None:
                    await self._stream(writer, watched)
                    return
                status, body = (
                    (404, not_found()) if query.get("watch") == "1" else self._answer(url.path, query)
                )
                data = json.dumps(body).encode()
                head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}"
                writer.write(head.encode() + b"\r\n\r\n" + data)
                await writer.drain()
        finally:
            writer.close()

    def _answer(self, path: str, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        if path == self.pods_path:
            items = self._selected(query.get("labelSelector", ""))
            return 200, {
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.version)},
                "items": items,
            }
        if path == f"{self.pools_path}/{self._pool_name}":
            if self.pool is not None:
                return 200, self.pool
            group = self.pools_path.split("/")[2]
            return 404, not_found(f'inferencepools.{group} "{self._pool_name}" not found')
        return 404, not_found()

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
