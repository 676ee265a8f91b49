"""Following an InferencePool and its pods with the API's list/watch protocol, over httpx.

Speed does not matter here: a few requests a minute. The pool is fetched, its pods listed by the pool's
selector, and both watched. A change of the pool's selector or ports re-lists the pods; a watch that
expired (410 Gone) re-lists; a deleted pool empties the pod set until it is back; any other failure
backs off (:data:`RETRY`) and starts over from a fresh GET of the pool, keeping the last known pods
meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from pointsman_collector.errors import DiscoveryError
from pointsman_collector.kubernetes.credentials import KubeAccess
from pointsman_collector.kubernetes.objects import PodTable, PoolSpec, pool_spec
from pointsman_collector.targets import OnChange
from pointsman_shared.backoff import Backoff, Jitter

log = logging.getLogger(__name__)

# The API server ends a watch after this long; it is then resumed from the last resourceVersion.
WATCH_SECONDS = 300
# A watch is silent while nothing changes: the client's read timeout must outlast it by a margin.
WATCH_SLACK = 30.0
# 0.5 s doubling to 10 s, no jitter. The last known pods stay and are scraped meanwhile, so no
# staleness budget bounds the cap; it bounds how late a recovered API server is noticed. One
# collector (or a few replicas) per pool does not make a herd worth jittering.
RETRY = Backoff(initial=0.5, factor=2.0, maximum=10.0, jitter=Jitter.NONE)


class Relist(Exception):
    """The watch cannot resume (410 Gone, or an ERROR event): list again."""


class _SpecChanged(Exception):
    """The pool's selector or ports changed (``spec``), or the pool was deleted (``spec`` is None)."""

    def __init__(self, spec: PoolSpec | None, version: str) -> None:
        self.spec = spec
        self.version = version


class KubernetesTargets:
    """Follows an InferencePool and its pods; calls ``on_change`` with the endpoints whenever they change.

    A :class:`~pointsman_collector.targets.TargetSource`: :meth:`follow` takes the callback; ``run``
    uses the one given here.
    """

    name = "kubernetes"

    def __init__(
        self,
        access: KubeAccess,
        *,
        pool: str,
        api_version: str,
        on_change: OnChange | None = None,
        backoff: Backoff = RETRY,
        watch_seconds: int = WATCH_SECONDS,
        rng: random.Random | None = None,
    ) -> None:
        self._access = access
        self._pool = pool
        self._api_version = api_version  # GROUP/VERSION: the pools' path is /apis/GROUP/VERSION/...
        self._pools_path = f"/apis/{api_version}/namespaces/{access.namespace}/inferencepools"
        self._pods_path = f"/api/v1/namespaces/{access.namespace}/pods"
        self._on_change = on_change
        self._backoff = backoff
        self._watch_seconds = watch_seconds
        self._rng = rng or random.Random()
        self._table = PodTable()
        self.endpoints: tuple[str, ...] = ()
        self.synced = asyncio.Event()  # set once the pods have been listed

    async def follow(self, on_change: OnChange) -> None:
        """Follow the pool until cancelled, calling ``on_change`` with the first listed set (an empty
        one too) and with every change after it."""
        self._on_change = on_change
        await self.run()

    async def run(self) -> None:
        """Follow the pool until cancelled; failures are logged and retried with backoff."""
        failures = 0
        last_error = ""
        async with self._access.client(read_timeout=self._watch_seconds + WATCH_SLACK) as client:
            while True:
                try:
                    await self._session(client)
                except Exception as exc:  # an API failure, an odd object, or a bug: never stop for good
                    message = f"{type(exc).__name__}: {exc}"
                    if message != last_error:
                        expected = isinstance(exc, DiscoveryError | httpx.HTTPError | ValueError | KeyError)
                        log.warning(
                            "kubernetes discovery: %s; retrying (keeping %d endpoints)",
                            message,
                            len(self.endpoints),
                            exc_info=None if expected else exc,
                        )
                    last_error = message
                    failures += 1
                    await asyncio.sleep(self._backoff.delay(failures, self._rng))
                else:
                    failures = 0

    async def _session(self, client: httpx.AsyncClient) -> None:
        pool = await self._get(client, f"{self._pools_path}/{self._pool}")
        spec = pool_spec(pool, self._api_version)
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
                    if kind in ("ADDED", "MODIFIED") and (new := pool_spec(obj, self._api_version)) != spec:
                        raise _SpecChanged(new, version)
            except Relist:
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
            except Relist:
                continue

    def _emit(self, spec: PoolSpec) -> None:
        endpoints = self._table.endpoints(spec.ports)
        if endpoints != self.endpoints:
            log.info("kubernetes discovery: %d endpoints", len(endpoints))
            self.endpoints = endpoints
        elif self.synced.is_set():
            return
        # The first list is reported even when it is empty: whoever waits for it may start then.
        if self._on_change is not None:
            self._on_change(endpoints)

    async def _get(
        self, client: httpx.AsyncClient, path: str, params: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        return await get_object(client, path, params)

    def _watch(
        self, client: httpx.AsyncClient, path: str, params: Mapping[str, str], version: str
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        return watch_events(client, path, params, version, self._watch_seconds)


class ApiStatus(DiscoveryError):
    """The API server answered with another status than 200 (``status``)."""

    def __init__(self, detail: str, status: int) -> None:
        super().__init__("kubernetes", detail)
        self.status = status


async def get_object(
    client: httpx.AsyncClient, path: str, params: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The JSON object at ``path``; :class:`ApiStatus` for another status than 200."""
    response = await client.get(path, params=params)
    if response.status_code != 200:
        raise ApiStatus(f"GET {path}: HTTP {response.status_code}", response.status_code)
    doc = response.json()
    if not isinstance(doc, dict):
        raise DiscoveryError("kubernetes", f"GET {path}: not an object")
    return doc


async def watch_events(
    client: httpx.AsyncClient, path: str, params: Mapping[str, str], version: str, seconds: int
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The events of one watch request, until the server ends it. Raises :class:`Relist`."""
    query = {
        **params,
        "watch": "1",
        "resourceVersion": version,
        "allowWatchBookmarks": "true",
        "timeoutSeconds": str(seconds),
    }
    async with client.stream("GET", path, params=query) as response:
        if response.status_code == 410:
            raise Relist
        if response.status_code != 200:
            raise ApiStatus(f"watch {path}: HTTP {response.status_code}", response.status_code)
        async for line in response.aiter_lines():
            if not line.strip():
                continue
            event = json.loads(line)
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                # Usually 410 Gone: the resourceVersion is too old to resume from.
                raise Relist
            yield str(kind), obj
