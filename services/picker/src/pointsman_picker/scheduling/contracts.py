"""The contracts of the scheduling plugins, of the request lifecycle, and the view of the pods that
filters read.

A profile runs its filters (a tree of them: :mod:`~pointsman_picker.scheduling.tree`), then its scorers
(each clamped to [0, 1], then weighted and summed), then its picker. Each gets the request's
:class:`~pointsman_picker.scheduling.types.CycleState` and declares the data it ``consumes`` from it.
Randomness comes in as an argument. A plugin's ``type_name`` is its ``type`` in the config's
``plugins``.

A :class:`RequestPlugin` lives across requests (its state outlives them: recent assignments, a prefix
index) and hooks into each request's life (:mod:`~pointsman_picker.scheduling.lifecycle` runs them):
``prepare`` before the filters (it may write the data it ``produces`` and refine the pods' numbers),
``picked`` once the request has its pod, ``finished`` when the request has ended. Time comes in as an
argument. A filter, scorer or picker may be one too.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple, Protocol

from pointsman_picker.scheduling.types import CycleState, DataKey, Pods, SchedulingRequest
from pointsman_shared.snapshot import PodSnapshot

DataKeys = tuple[DataKey[Any], ...]


class Filter(Protocol):
    """Keeps some of the pods, in order; keeping none sends the node's input to its failure branch."""

    __slots__ = ()
    type_name: ClassVar[str]
    consumes: ClassVar[DataKeys] = ()

    def __call__(
        self, request: SchedulingRequest, pods: Pods, state: CycleState, rng: random.Random
    ) -> Pods: ...


class Scorer(Protocol):
    """One score per pod, in order, in [0, 1] (1 is best)."""

    __slots__ = ()
    type_name: ClassVar[str]
    consumes: ClassVar[DataKeys] = ()

    def __call__(self, request: SchedulingRequest, pods: Pods, state: CycleState) -> list[float]: ...


class Picker(Protocol):
    """The pod the request goes to; ``scores`` are the weighted sums, ``None`` without scorers."""

    __slots__ = ()
    type_name: ClassVar[str]
    consumes: ClassVar[DataKeys] = ()

    def __call__(
        self, pods: Pods, scores: list[float] | None, state: CycleState, rng: random.Random
    ) -> PodSnapshot: ...


class Ticket(NamedTuple):
    """One request that got a pod: ``key`` is unique among this picker's requests, ``at`` the time of
    the decision. What a plugin hears at ``picked`` and again at ``finished``."""

    key: int
    address: str
    at: float


class RequestPlugin:
    """A plugin with state across requests and hooks in each request's life; the hooks it does not
    override cost nothing (the lifecycle calls only overridden ones).

    ``spec`` is what the plugin was made from (its type and parameters): a config reload that builds a
    plugin of the same spec keeps the running one, state and all.
    """

    type_name: ClassVar[str]
    produces: ClassVar[DataKeys] = ()
    consumes: ClassVar[DataKeys] = ()
    spec: tuple[str, str] = ("", "")

    def prepare(self, request: SchedulingRequest, pods: Pods, state: CycleState, now: float) -> Pods:
        """Before the filters: write what the plugin produces into ``state``; return ``pods``, or the
        pods with numbers of the plugin's own (at the same positions)."""
        return pods

    def picked(self, ticket: Ticket, request: SchedulingRequest, state: CycleState) -> None:
        """The request got its pod (``ticket.address``)."""

    def finished(self, ticket: Ticket) -> None:
        """The request ``ticket`` names has ended (its stream closed). A ticket the plugin never saw is
        ignored: the plugin may have been made by a reload after the request's pick."""

    def note(self, state: CycleState) -> str:
        """A few words for the explain header's head (``""``: nothing to say)."""
        return ""


Mask = Sequence[int]  # one truth value per pod


# Per target model: the positions of the pods with the target active, and of the other pods with a free
# adapter slot (see ``PodFacts.take``).
LoraGroups = tuple[Sequence[int], Sequence[int]]


class PodFacts(Protocol):
    """What filters read of the pods: one view, whether the pods carry their facts or not.

    Every method is asked about the pods the view was got for (``facts_of(pods)``); it does not hold
    them, as a view made per filter call would cost more than a small pool's whole filter. The methods
    that keep pods answer in one pass over plain pods, as a filter written for them would.
    """

    def waiting(self, pods: Pods) -> Sequence[int]: ...

    def max_waiting(self, pods: Pods) -> int:
        """The most waiting requests; 0 without pods."""
        ...

    def waiting_range(self, pods: Pods) -> tuple[int, int]:
        """The fewest and the most waiting requests; ``(0, 0)`` without pods."""
        ...

    def waiting_at_most(self, pods: Pods, limit: int) -> Pods:
        """The pods with at most ``limit`` waiting requests."""
        ...

    def kv(self, pods: Pods) -> Sequence[float]: ...

    def kv_range(self, pods: Pods) -> tuple[float, float]:
        """The least and the most KV-cache use; ``(0.0, 0.0)`` without pods."""
        ...

    def kv_at_most(self, pods: Pods, limit: float) -> Pods:
        """The pods with KV-cache use at most ``limit``."""
        ...

    def capacity(self, pods: Pods, queue: int, kv: float) -> Pods:
        """The pods with at most ``queue`` waiting requests and KV-cache use at most ``kv``."""
        ...

    def lora(self, pods: Pods, target: str | None) -> LoraGroups: ...

    def take(self, pods: Pods, positions: Sequence[int]) -> Pods:
        """The pods at ``positions`` (a LoRA group), in order."""
        ...

    def least_load(self, pods: Pods, positions: Sequence[int]) -> int:
        """The least load (running plus waiting requests) of the pods at ``positions``, some."""
        ...

    def total_load(self, pods: Pods) -> int:
        """The load (running plus waiting requests) of all the pods."""
        ...

    def slots(self, pods: Pods) -> int:
        """The adapter slots of all the pods (their ``max_lora``)."""
        ...

    def starved(self, pods: Pods) -> bool:
        """Whether some pod has an adapter waiting without running (waiting for a slot)."""
        ...

    def select(self, pods: Pods, mask: Mask) -> Pods:
        """The pods whose mask value is true, in order."""
        ...
