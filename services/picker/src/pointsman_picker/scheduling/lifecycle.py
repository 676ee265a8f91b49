"""A profile's request lifecycle: its :class:`~pointsman_picker.scheduling.contracts.RequestPlugin`\\ s,
ordered so that each runs after the producers of what it consumes, and their hooks run in that order.

The director calls :meth:`Lifecycle.prepare` before the profile's filters, :meth:`Lifecycle.picked`
once a request has its pod and :meth:`Lifecycle.finished` when it has ended. Only the hooks a plugin
overrides are called.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pointsman_picker.scheduling.contracts import DataKeys, RequestPlugin, Ticket
from pointsman_picker.scheduling.types import CycleState, DataKey, Pods, SchedulingRequest

PrepareHook = Callable[[SchedulingRequest, Pods, CycleState, float], Pods]
PickedHook = Callable[[Ticket, SchedulingRequest, CycleState], None]
FinishedHook = Callable[[Ticket], None]


class LifecycleError(ValueError):
    """The plugins cannot be ordered: a key nobody produces, two producers of one key, a cycle."""


def _overrides(plugin: RequestPlugin, hook: str) -> bool:
    return getattr(type(plugin), hook) is not getattr(RequestPlugin, hook)


class Lifecycle:
    def __init__(self, plugins: Sequence[RequestPlugin]) -> None:
        """``plugins`` in an order where every producer comes before its consumers (see :func:`order`)."""
        self.plugins = tuple(plugins)
        self._prepare: tuple[PrepareHook, ...] = tuple(p.prepare for p in plugins if _overrides(p, "prepare"))
        self._picked: tuple[PickedHook, ...] = tuple(p.picked for p in plugins if _overrides(p, "picked"))
        self._finished: tuple[FinishedHook, ...] = tuple(
            p.finished for p in plugins if _overrides(p, "finished")
        )
        self._noting = tuple(p for p in plugins if _overrides(p, "note"))

    def hooks(self) -> tuple[tuple[PrepareHook, ...], tuple[PickedHook, ...], tuple[FinishedHook, ...]]:
        """The overridden ``prepare``, ``picked`` and ``finished`` hooks, in order: for a caller that
        runs them itself."""
        return self._prepare, self._picked, self._finished

    def by_spec(self) -> dict[tuple[str, str], RequestPlugin]:
        """The plugins by what they were made from: what a reload may keep."""
        return {plugin.spec: plugin for plugin in self.plugins}

    def prepare(self, request: SchedulingRequest, pods: Pods, state: CycleState, now: float) -> Pods:
        for prepare in self._prepare:
            pods = prepare(request, pods, state, now)
        return pods

    def picked(self, ticket: Ticket, request: SchedulingRequest, state: CycleState) -> None:
        for picked in self._picked:
            picked(ticket, request, state)

    def finished(self, ticket: Ticket) -> None:
        for finished in self._finished:
            finished(ticket)

    def notes(self, state: CycleState) -> list[str]:
        return [note for plugin in self._noting if (note := plugin.note(state))]


def order(
    plugins: Iterable[RequestPlugin],
    wanted: DataKeys,
    producer_of: Callable[[DataKey[Any]], RequestPlugin | None],
    given: DataKeys = (),
) -> list[RequestPlugin]:
    """``plugins`` and the producers of every key they or ``wanted`` consume (``producer_of`` makes one
    for a key none of them produces; ``given`` keys are the director's), each producer before its
    consumers; :class:`LifecycleError` names what cannot be ordered."""
    chosen: list[RequestPlugin] = []
    producers: dict[DataKey[Any], RequestPlugin] = {}

    def add(plugin: RequestPlugin) -> None:
        if any(plugin is p for p in chosen):
            return
        chosen.append(plugin)
        for key in plugin.produces:
            other = producers.setdefault(key, plugin)
            if other is not plugin:
                raise LifecycleError(
                    f"{key.name!r} is produced by both {other.type_name} and {plugin.type_name}"
                )

    for plugin in plugins:
        add(plugin)
    todo = [*wanted, *(key for plugin in chosen for key in plugin.consumes)]
    while todo:
        key = todo.pop()
        if key in producers or key in given:
            continue
        made = producer_of(key)
        if made is None:
            raise LifecycleError(f"nothing produces {key.name!r}")
        add(made)
        todo += made.consumes
    return _topological(chosen, producers)


def _topological(
    plugins: list[RequestPlugin], producers: Mapping[DataKey[Any], RequestPlugin]
) -> list[RequestPlugin]:
    ordered: list[RequestPlugin] = []
    state: dict[int, bool] = {}  # id -> done (False: on the current path)

    def visit(plugin: RequestPlugin, path: tuple[str, ...]) -> None:
        done = state.get(id(plugin))
        if done:
            return
        if done is False:
            raise LifecycleError("the plugins consume each other's data in a cycle: " + " -> ".join(path))
        state[id(plugin)] = False
        for key in plugin.consumes:
            producer = producers.get(key)
            if producer is not None and producer is not plugin:  # a plugin may read what it wrote
                visit(producer, (*path, producer.type_name))
        state[id(plugin)] = True
        ordered.append(plugin)

    for plugin in plugins:  # the given order where the data allows it
        visit(plugin, (plugin.type_name,))
    return ordered
