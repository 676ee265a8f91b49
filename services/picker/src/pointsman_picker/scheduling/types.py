"""What the scheduling core takes and returns: the request, the pods, one request's cycle state, and a
dropped request's outcome."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, NamedTuple, TypeVar

from pointsman_shared.snapshot import PodSnapshot

Pods = tuple[PodSnapshot, ...]

T = TypeVar("T")

NO_BODY: Mapping[str, Any] = MappingProxyType({})


class SchedulingRequest(NamedTuple):
    """``target_model`` is the resolved model (the LoRA adapter to look for); ``None`` when the request
    names no model (e.g. a GET without a body). ``body`` is the request's JSON object as parsed (read
    it, never change it): plugins take what they need of it (the prompt, its length) into the cycle
    state."""

    target_model: str | None
    critical: bool
    body: Mapping[str, Any] = NO_BODY
    request_id: str = ""


@dataclass(frozen=True, slots=True, eq=False)
class DataKey(Generic[T]):
    """The name of one kind of data in a :class:`CycleState`: what a plugin declares it produces or
    consumes. Keys compare by identity; ``name`` is for errors and docs."""

    name: str

    def __repr__(self) -> str:
        return f"DataKey({self.name!r})"


class CycleState(dict[DataKey[Any], Any]):
    """One request's data on its way through the lifecycle: written by the plugins that produce it
    (before the filters run, or while they run), read by the filters, scorers, pickers and hooks that
    consume it. Made anew for every request; a plugin keeps what outlives the request itself."""

    __slots__ = ()

    def read(self, key: DataKey[T], default: T) -> T:
        value: T = self.get(key, default)
        return value

    def write(self, key: DataKey[T], value: T) -> None:
        self[key] = value


@dataclass(frozen=True, slots=True)
class Drop:
    """The request is dropped (no pod can take it): what a profile returns then, and the terminal
    branch of a filter tree that says so."""

    reason: str
