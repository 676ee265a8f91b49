"""Following the pool's InferenceObjectives and InferenceModelRewrites in every API version that serves
them (:data:`~.cluster_objects.API_VERSIONS`), with list/watch over httpx.

Each (kind, API version) is followed on its own: listed, then watched from the list's
resourceVersion. A 404 on the list is a CRD not installed (``absent``), a 403 a Role without it
(``forbidden``): the objects of that kind and version are dropped, the state is logged once and counted,
and the list is tried again with backoff, so a CRD installed later, or a Role granted later, is
picked up. Any other failure (``failing``: the API server unreachable) keeps the last objects read and
retries the same way. Every change of the objects or the states calls ``on_change`` with the whole set
(:func:`~.cluster_objects.read_objects`), once it differs from the last one.

With ``write_status``, each object of the pool gets an ``Accepted`` condition (True, or False with the
refusal's reason) for its generation, patched into its status subresource when it differs; a 403 there
turns status writing off for that kind and version (logged once): the Role did not grant it.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import httpx

from pointsman_collector.kubernetes.cluster_objects import (
    API_VERSIONS,
    RESOURCES,
    Invalid,
    PoolRef,
    belongs,
    identity,
    objective,
    read_objects,
    rewrite,
)
from pointsman_collector.kubernetes.credentials import KubeAccess
from pointsman_collector.kubernetes.watch import (
    RETRY,
    WATCH_SECONDS,
    WATCH_SLACK,
    ApiStatus,
    Relist,
    get_object,
    watch_events,
)
from pointsman_shared.backoff import Backoff
from pointsman_shared.cluster import OBJECTIVE, ClusterObjects, Kind, WatchState, WatchStatus

log = logging.getLogger(__name__)

OnObjects = Callable[[ClusterObjects], None]
# Told each failed list or watch: kind, API version and the state it leads to.
OnFailure = Callable[[Kind, str, WatchStatus], None]

ACCEPTED = "Accepted"


class ClusterObjectsWatch:
    def __init__(
        self,
        access: KubeAccess,
        *,
        pool: PoolRef,
        on_change: OnObjects | None = None,
        on_failure: OnFailure | None = None,
        write_status: bool = True,
        backoff: Backoff = RETRY,
        watch_seconds: int = WATCH_SECONDS,
        rng: random.Random | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._access = access
        self._pool = pool
        self._on_change = on_change
        self._on_failure = on_failure
        self._write_status = write_status
        self._backoff = backoff
        self._watch_seconds = watch_seconds
        self._rng = rng or random.Random()
        self._clock = clock
        self._listed: dict[tuple[Kind, str], dict[str, Mapping[str, Any]]] = {}
        self._states: dict[tuple[Kind, str], WatchState] = {}
        self._status_forbidden: set[tuple[Kind, str]] = set()
        self._status_lock = asyncio.Lock()  # one writer: the kinds' follows would patch an object twice
        self.objects = ClusterObjects()
        self.changed = asyncio.Event()  # set at each change (tests wait on it)

    @property
    def pool(self) -> PoolRef:
        """The pool whose objects are followed."""
        return self._pool

    def listen(self, on_change: OnObjects, on_failure: OnFailure | None = None) -> None:
        """Call ``on_change`` with each new set (and now, with the current one), ``on_failure`` with each
        failed list or watch."""
        self._on_change, self._on_failure = on_change, on_failure
        on_change(self.objects)

    async def run(self) -> None:
        """Follow every kind and version until cancelled; nothing here ends on a failure."""
        async with self._access.client(read_timeout=self._watch_seconds + WATCH_SLACK) as client:
            follows = [
                asyncio.create_task(self._follow(client, kind, api_version), name=f"{kind} {api_version}")
                for api_version in API_VERSIONS
                for kind in RESOURCES
            ]
            try:
                await asyncio.gather(*follows)
            finally:
                for task in follows:
                    task.cancel()
                await asyncio.gather(*follows, return_exceptions=True)

    def _path(self, kind: Kind, api_version: str) -> str:
        return f"/apis/{api_version}/namespaces/{self._access.namespace}/{RESOURCES[kind]}"

    async def _follow(self, client: httpx.AsyncClient, kind: Kind, api_version: str) -> None:
        key = (kind, api_version)
        path = self._path(kind, api_version)
        failures = 0
        while True:
            try:
                listed = await get_object(client, path)
                items = listed.get("items") or []
                if not isinstance(items, list):
                    raise Invalid("the list's items are not a list")
                self._listed[key] = {identity(obj)[0]: obj for obj in items if isinstance(obj, Mapping)}
                self._state(key, "watching")
                failures = 0
                await self._changed(client)
                version = str((listed.get("metadata") or {}).get("resourceVersion", ""))
                while True:
                    async for event, obj in watch_events(client, path, {}, version, self._watch_seconds):
                        version = str((obj.get("metadata") or {}).get("resourceVersion", version))
                        name = identity(obj)[0]
                        if event in ("ADDED", "MODIFIED"):
                            self._listed[key][name] = obj
                        elif event == "DELETED":
                            self._listed[key].pop(name, None)
                        else:
                            continue
                        await self._changed(client)
            except Relist:
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # an API failure, an odd object, or a bug: retried, never fatal
                failures += 1
                status = exc.status if isinstance(exc, ApiStatus) else 0
                state: WatchStatus = (
                    "absent" if status == 404 else "forbidden" if status == 403 else "failing"
                )
                if state != "failing":
                    self._listed.pop(key, None)  # no CRD, or no right to see it: no objects of it
                self._state(key, state, f"{type(exc).__name__}: {exc}", exc)
                if self._on_failure is not None:
                    self._on_failure(kind, api_version, state)
                await self._changed(client)
                await asyncio.sleep(self._backoff.delay(failures, self._rng))

    def _state(
        self, key: tuple[Kind, str], status: WatchStatus, detail: str = "", exc: Exception | None = None
    ) -> None:
        old = self._states.get(key)
        if old is not None and (old.status, old.detail) == (status, detail):
            return
        kind, api_version = key
        self._states[key] = WatchState(kind, api_version, status, detail)
        if status == "watching":
            log.info("watching %s %s", kind, api_version)
        else:
            expected = isinstance(exc, ApiStatus | httpx.HTTPError | Invalid | ValueError)
            why = {"absent": "the CRD is not installed", "forbidden": "the Role does not allow listing it"}
            log.warning(
                "%s %s: %s (%s); retrying",
                kind,
                api_version,
                why.get(status, "cannot list or watch"),
                detail,
                exc_info=None if expected else exc,
            )

    async def _changed(self, client: httpx.AsyncClient) -> None:
        objects = read_objects(
            {key: list(objs.values()) for key, objs in self._listed.items()},
            self._states.values(),
            self._pool,
        )
        if objects != self.objects:
            for refused in set(objects.refused) - set(self.objects.refused):
                log.warning(
                    "%s %s (%s, generation %d) refused: %s",
                    refused.kind,
                    refused.name,
                    refused.api_version,
                    refused.generation,
                    refused.reason,
                )
            self.objects = objects
            if self._on_change is not None:
                self._on_change(objects)
            self.changed.set()
        if self._write_status:
            async with self._status_lock:
                await self._statuses(client)

    async def _statuses(self, client: httpx.AsyncClient) -> None:
        """Patch each object of the pool whose Accepted condition is not the one for its generation."""
        refused = {(r.kind, r.api_version, r.name): r.reason for r in self.objects.refused}
        for (kind, api_version), objs in list(self._listed.items()):
            if (kind, api_version) in self._status_forbidden:
                continue
            for name, obj in list(objs.items()):
                if not belongs(obj, self._pool):
                    continue
                reason = refused.get((kind, api_version, name))
                if reason is None:
                    try:
                        (objective if kind == OBJECTIVE else rewrite)(obj, api_version)
                    except Invalid as exc:  # refused, but not listed as such: should not happen
                        reason = str(exc)
                wanted = accepted_condition(obj, reason, self._clock())
                if _current(obj, wanted):
                    continue
                path = f"{self._path(kind, api_version)}/{name}/status"
                patch = {"status": {"conditions": _merged(obj, wanted)}}
                try:
                    response = await client.patch(
                        path, json=patch, headers={"Content-Type": "application/merge-patch+json"}
                    )
                except httpx.HTTPError as exc:
                    log.warning("cannot write the status of %s %s: %s", kind, name, exc)
                    return
                if response.status_code == 403:
                    log.warning(
                        "%s %s: the Role does not allow writing status; not writing it", kind, api_version
                    )
                    self._status_forbidden.add((kind, api_version))
                    break
                if response.status_code == 200:
                    objs[name] = response.json()
                elif response.status_code != 404:  # 404: deleted meanwhile
                    log.warning("cannot write the status of %s %s: HTTP %d", kind, name, response.status_code)


def accepted_condition(obj: Mapping[str, Any], reason: str | None, now: datetime) -> dict[str, Any]:
    """The Accepted condition for ``obj``'s generation: True, or False with the refusal's ``reason``."""
    return {
        "type": ACCEPTED,
        "status": "True" if reason is None else "False",
        "reason": "Accepted" if reason is None else "Invalid",
        "message": "" if reason is None else reason[:32768],
        "observedGeneration": identity(obj)[1],
        "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _conditions(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    status = obj.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    return [c for c in conditions if isinstance(c, dict)] if isinstance(conditions, list) else []


def _current(obj: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    fields = ("status", "reason", "message", "observedGeneration")
    return any(
        c.get("type") == ACCEPTED and all(c.get(f) == wanted[f] for f in fields) for c in _conditions(obj)
    )


def _merged(obj: Mapping[str, Any], wanted: dict[str, Any]) -> list[dict[str, Any]]:
    """The object's conditions with Accepted replaced; the CRD's placeholder (Pending) dropped."""
    kept = [c for c in _conditions(obj) if c.get("type") != ACCEPTED and c.get("reason") != "Pending"]
    for old in _conditions(obj):  # the transition time moves only when the status does
        if old.get("type") == ACCEPTED and old.get("status") == wanted["status"]:
            wanted = {
                **wanted,
                "lastTransitionTime": old.get("lastTransitionTime", wanted["lastTransitionTime"]),
            }
    return [*kept, wanted]
