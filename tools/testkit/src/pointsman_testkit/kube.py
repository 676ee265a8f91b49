"""A local Kubernetes API for custom resources: list, watch and status patches over HTTP/1.1, with CRDs
that are installed or not, RBAC that grants or refuses, and objects checked against the CRDs' real
schemas (``tests/deploy/data/*-crds``) as the API server checks them on create and update.

- a resource whose CRD is not installed answers 404, as the API server does;
- a call the granted permissions do not cover answers 403 (``allowed`` None grants everything);
- watches stream events as chunked JSON lines, from a list's resourceVersion on;
- ``create``, ``replace`` and ``delete`` stamp ``resourceVersion``, ``generation`` (moved by a change of
  ``spec``), ``creationTimestamp`` and ``uid``, and send the event to the watchers.

Test code only.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonschema  # type: ignore[import-untyped]
import yaml

Permission = tuple[str, str, str, str]  # namespace, API group, resource (or resource/status), verb
Key = tuple[str, str]  # group/version, resource (plural)


@dataclass(frozen=True)
class Crd:
    group_version: str
    resource: str
    kind: str
    schema: dict[str, Any]


def read_crds(*paths: Path) -> list[Crd]:
    """Every served version of the CustomResourceDefinitions in ``paths``."""
    crds = []
    for path in paths:
        doc = yaml.safe_load(path.read_text())
        spec = doc["spec"]
        for version in spec["versions"]:
            if version["served"]:
                crds.append(
                    Crd(
                        f"{spec['group']}/{version['name']}",
                        spec["names"]["plural"],
                        spec["names"]["kind"],
                        version["schema"]["openAPIV3Schema"],
                    )
                )
    return crds


class Invalid(ValueError):
    """The API server would refuse the object (422)."""


@dataclass
class _Store:
    crd: Crd
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    watchers: set[asyncio.Queue[dict[str, Any] | None]] = field(default_factory=set)


class KubeApi:
    def __init__(self, namespace: str = "default", *, allowed: set[Permission] | None = None) -> None:
        self.namespace = namespace
        self.allowed = allowed
        self.requests: list[Permission] = []
        self._crds: dict[Key, Crd] = {}
        self._stores: dict[Key, _Store] = {}
        self._version = itertools.count(100)
        self._uids = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._answering: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._changed = asyncio.Event()

    # --- the cluster's state --------------------------------------------------------------------------

    def install(self, crds: Iterable[Crd]) -> None:
        """Serve these CRDs' resources (objects created while one was absent are not kept)."""
        for crd in crds:
            key = (crd.group_version, crd.resource)
            self._crds[key] = crd
            self._stores.setdefault(key, _Store(crd))

    def uninstall(self, crds: Iterable[Crd]) -> None:
        """Stop serving them: their objects are gone, their watches end."""
        for crd in crds:
            key = (crd.group_version, crd.resource)
            self._crds.pop(key, None)
            store = self._stores.pop(key, None)
            if store is not None:
                for queue in store.watchers:
                    queue.put_nowait(None)

    def create(self, obj: dict[str, Any], *, created: str = "2026-12-01T00:00:00Z") -> dict[str, Any]:
        store = self._store_of(obj)
        name = obj["metadata"]["name"]
        if name in store.objects:
            raise Invalid(f"{name} exists")
        obj = self._checked(store, obj)
        obj["metadata"].update(generation=1, creationTimestamp=created, uid=f"uid-{next(self._uids)}")
        return self._put(store, obj, "ADDED")

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Update an object (its spec; its status stays the stored one, as on the main resource)."""
        store = self._store_of(obj)
        old = store.objects[obj["metadata"]["name"]]
        obj = self._checked(store, obj)
        generation = old["metadata"]["generation"] + (obj.get("spec") != old.get("spec"))
        obj["metadata"].update(
            generation=generation,
            creationTimestamp=old["metadata"]["creationTimestamp"],
            uid=old["metadata"]["uid"],
        )
        if "status" in old:
            obj["status"] = old["status"]
        return self._put(store, obj, "MODIFIED")

    def delete(self, obj: dict[str, Any]) -> None:
        store = self._store_of(obj)
        gone = store.objects.pop(obj["metadata"]["name"])
        gone["metadata"]["resourceVersion"] = str(next(self._version))
        self._send(store, {"type": "DELETED", "object": gone})

    def get(self, obj: dict[str, Any]) -> dict[str, Any]:
        """The stored object (its status as the collector wrote it)."""
        return copy.deepcopy(self._store_of(obj).objects[obj["metadata"]["name"]])

    def _store_of(self, obj: dict[str, Any]) -> _Store:
        for (group_version, _), store in self._stores.items():
            if group_version == obj["apiVersion"] and store.crd.kind == obj["kind"]:
                return store
        raise Invalid(f"no CRD serves {obj['kind']} {obj['apiVersion']}")

    def _checked(self, store: _Store, obj: dict[str, Any]) -> dict[str, Any]:
        errors = [e.message for e in jsonschema.Draft7Validator(store.crd.schema).iter_errors(obj)]
        if errors:
            raise Invalid("; ".join(errors))
        obj = copy.deepcopy(obj)
        obj["metadata"].setdefault("namespace", self.namespace)
        return obj

    def _put(self, store: _Store, obj: dict[str, Any], event: str) -> dict[str, Any]:
        obj["metadata"]["resourceVersion"] = str(next(self._version))
        store.objects[obj["metadata"]["name"]] = obj
        self._send(store, {"type": event, "object": obj})
        return copy.deepcopy(obj)

    def _send(self, store: _Store, event: dict[str, Any]) -> None:
        for queue in store.watchers:
            queue.put_nowait(copy.deepcopy(event))

    # --- HTTP ----------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> KubeApi:
        self._server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        return self

    async def aclose(self) -> None:
        for store in self._stores.values():
            for queue in store.watchers:
                queue.put_nowait(None)
        if self._server is not None:
            self._server.close()
        # Idle keep-alive connections end when closed (cancelling their tasks would be logged by 3.11).
        for writer in list(self._writers):
            writer.close()
        await asyncio.gather(*self._answering, return_exceptions=True)

    async def requested(self, count: int, verb: str | None = None) -> None:
        """Wait until ``count`` calls (of ``verb``, if given) have come."""
        async with asyncio.timeout(10):
            while sum(verb is None or p[3] == verb for p in self.requests) < count:
                self._changed.clear()
                await self._changed.wait()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)
        self._writers.add(writer)
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; ``False`` when the connection is done."""
        line = (await reader.readline()).decode()
        if not line:
            return False
        method, target, _ = line.split(" ")
        length = 0
        while (header := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = header.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        sent = await reader.readexactly(length) if length else b""
        url = urlsplit(target)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        parts = url.path.strip("/").split("/")
        # /apis/GROUP/VERSION/namespaces/NS/RESOURCE[/NAME[/status]]
        if parts[0] != "apis" or len(parts) < 6:
            return await _reply(writer, 404, _status(404, "NotFound"))
        group_version, namespace, resource, rest = "/".join(parts[1:3]), parts[4], parts[5], parts[6:]
        watch = query.get("watch") == "1"
        subresource = f"{resource}/{rest[1]}" if len(rest) == 2 else resource
        verb = "patch" if method == "PATCH" else "get" if rest else "watch" if watch else "list"
        permission = (namespace, group_version.split("/")[0], subresource, verb)
        self.requests.append(permission)
        self._changed.set()
        store = self._stores.get((group_version, resource))
        if self.allowed is not None and permission not in self.allowed:
            return await _reply(writer, 403, _status(403, "Forbidden"))
        if store is None or namespace != self.namespace:
            return await _reply(writer, 404, _status(404, "NotFound"))
        if watch:
            await self._stream(writer, store)
            return False
        if verb == "list":
            items = [copy.deepcopy(o) for o in store.objects.values()]
            version = str(next(self._version))
            return await _reply(writer, 200, {"items": items, "metadata": {"resourceVersion": version}})
        obj = store.objects.get(rest[0])
        if obj is None:
            return await _reply(writer, 404, _status(404, "NotFound"))
        if verb == "patch" and subresource.endswith("/status"):
            patch = json.loads(sent)
            obj = copy.deepcopy(obj)
            obj["status"] = {**obj.get("status", {}), **patch.get("status", {})}
            self._put(store, obj, "MODIFIED")
            return await _reply(writer, 200, obj)
        return await _reply(writer, 200 if verb == "get" else 405, obj)

    async def _stream(self, writer: asyncio.StreamWriter, store: _Store) -> None:
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        store.watchers.add(queue)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        try:
            while (event := await queue.get()) is not None:
                line = json.dumps(event).encode() + b"\n"
                writer.write(b"%x\r\n%s\r\n" % (len(line), line))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        finally:
            store.watchers.discard(queue)


def _status(code: int, reason: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code}


async def _reply(writer: asyncio.StreamWriter, status: int, body: dict[str, Any]) -> bool:
    data = json.dumps(body).encode()
    head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    with contextlib.suppress(ConnectionError):
        writer.write(head.encode() + data)
        await writer.drain()
    return True
