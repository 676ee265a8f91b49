"""A pool's pods carrying what the filters ask of every pod, worked out once per snapshot.

A snapshot serves every decision for ~50 ms, and at 512 pods one Python pass over the pool costs
about as much as a whole decision may. :class:`IndexedPods` is a tuple of pods like any other, so
every filter takes it; the #423 filters ask its facts (the waiting and KV-cache columns, the most
waiting, per-target LoRA groups, capacity masks) instead of making their pass. Each fact is worked
out when first asked for and then kept with the pool's pods, which serve every decision until the
next snapshot. The picker adds its own recent assignments to ``waiting`` before each decision:
:func:`with_waiting` makes those pods and carries the facts over, updated at the changed positions
only.

What a filter keeps is a plain tuple (or the pods themselves, when it keeps them all): a subset is new
with every decision, and working out its facts would cost the pass they save (a compress of the
pool's columns is no cheaper than a pass over a subset of a quarter of the pool).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import compress
from operator import itemgetter

from pointsman_picker.scheduling.types import Pods
from pointsman_shared.snapshot import PodSnapshot

SMALL = 16  # below this many pods, plain passes beat the facts' bookkeeping
Mask = Sequence[int]  # one truth value per pod
Take = Callable[[Pods], Pods]
# Per target model: what takes the pods with the target active, and the other pods with a free
# adapter slot; None for a group without pods.
LoraGroups = tuple[Take | None, Take | None]


class _Columns:
    """What ``waiting`` does not change: shared by the copies :func:`with_waiting` makes."""

    __slots__ = ("_kv", "_lora", "copies")

    def __init__(self) -> None:
        self._kv: list[float] | None = None
        self._lora: dict[str | None, LoraGroups] = {}
        # The pod at a position with another waiting, by (position, waiting): counts go up and down
        # by one as requests are assigned and end, and a copy costs more than the rest of with_waiting.
        self.copies: dict[tuple[int, int], PodSnapshot] = {}

    def kv(self, pods: Pods) -> list[float]:
        if self._kv is None:
            self._kv = [pod.kv_cache_usage for pod in pods]
        return self._kv

    def lora(self, pods: Pods, target: str | None) -> LoraGroups:
        groups = self._lora.get(target)
        if groups is None:
            near, free = lora_groups(pods, target)
            groups = self._lora[target] = (_take(near), _take(free))
        return groups


class _Facts:
    """The facts of one :class:`IndexedPods`."""

    __slots__ = ("_capacity", "_max_waiting", "_waiting", "columns")

    def __init__(
        self,
        columns: _Columns,
        waiting: list[int] | None = None,
        max_waiting: int | None = None,
        capacity: dict[tuple[int, float], bytearray] | None = None,
    ) -> None:
        self.columns = columns
        self._waiting = waiting
        self._max_waiting = max_waiting
        self._capacity = capacity if capacity is not None else {}

    def waiting(self, pods: Pods) -> list[int]:
        if self._waiting is None:
            self._waiting = [pod.waiting for pod in pods]
        return self._waiting

    def max_waiting(self, pods: Pods) -> int:
        if self._max_waiting is None:
            self._max_waiting = max(self.waiting(pods), default=0)
        return self._max_waiting

    def capacity(self, pods: Pods, queue: int, kv: float) -> bytearray:
        """The mask of pods with ``waiting <= queue`` and ``kv_cache_usage <= kv``."""
        mask = self._capacity.get((queue, kv))
        if mask is None:
            mask = self._capacity[(queue, kv)] = bytearray(
                [
                    w <= queue and u <= kv
                    for w, u in zip(self.waiting(pods), self.columns.kv(pods), strict=True)
                ]
            )
        return mask

    def changed(self, pods: Pods, waiting: Mapping[int, int]) -> _Facts:
        """The facts of ``pods`` with ``waiting`` changed at some positions."""
        if self._waiting is None:
            return _Facts(self.columns)
        column = self._waiting.copy()
        high = self._max_waiting
        for i, n in waiting.items():
            if high is not None and n < column[i] == high:
                high = None  # the maximum may have gone down: found again when asked for
            column[i] = n
        if high is not None:
            high = max(high, *waiting.values())
        capacity = {}
        if self._capacity:
            kv = self.columns.kv(pods)
            for (queue, kv_limit), old in self._capacity.items():
                mask = old.copy()
                for i, n in waiting.items():
                    mask[i] = n <= queue and kv[i] <= kv_limit
                capacity[(queue, kv_limit)] = mask
        return _Facts(self.columns, column, high, capacity)


class IndexedPods(tuple[PodSnapshot, ...]):
    """Pods (a tuple) carrying their :class:`_Facts`."""

    facts: _Facts

    def __new__(cls, pods: Iterable[PodSnapshot], facts: _Facts | None = None) -> IndexedPods:
        self = super().__new__(cls, pods)
        self.facts = facts if facts is not None else _Facts(_Columns())
        return self


def indexed(pods: Pods) -> Pods:
    """``pods`` indexed, unless a pass over them costs less than keeping their facts."""
    return pods if isinstance(pods, IndexedPods) or len(pods) < SMALL else IndexedPods(pods)


def facts_of(pods: Pods) -> _Facts | None:
    return pods.facts if isinstance(pods, IndexedPods) else None


def select(pods: Pods, mask: Mask) -> Pods:
    """The pods whose mask value is true, in order."""
    return tuple(compress(pods, mask))


def lora_groups(pods: Pods, target: str | None) -> tuple[list[int], list[int]]:
    """The positions of pods with ``target`` active, and of other pods with a free adapter slot."""
    affinity: list[int] = []
    available: list[int] = []
    for i, pod in enumerate(pods):
        active = pod.active_adapters
        if target is not None and target in active:
            affinity.append(i)
        elif len(active) < pod.max_lora:
            available.append(i)
    return affinity, available


def _take(positions: list[int]) -> Take | None:
    """Takes the pods at ``positions``: an itemgetter, whose cost follows the pods taken, not the pool."""
    if not positions:
        return None
    if len(positions) == 1:
        return lambda pods: (pods[positions[0]],)
    take: Take = itemgetter(*positions)
    return take


def with_waiting(pods: Pods, waiting: Mapping[int, int]) -> Pods:
    """``pods`` with the pod at each position of ``waiting`` replaced by a copy with that ``waiting``;
    facts carried over when ``pods`` has them."""
    if not waiting:
        return pods
    items = list(pods)
    if not isinstance(pods, IndexedPods):
        for i, n in waiting.items():
            items[i] = _copy(items[i], n)
        return tuple(items)
    copies = pods.facts.columns.copies
    for i, n in waiting.items():
        copy = copies.get((i, n))
        if copy is None:
            copy = copies[(i, n)] = _copy(items[i], n)
        items[i] = copy
    return IndexedPods(items, pods.facts.changed(pods, waiting))


def _copy(pod: PodSnapshot, waiting: int) -> PodSnapshot:
    # The constructor, not dataclasses.replace: half the cost, and a copy is made per decision. A test
    # checks that every field comes across.
    return PodSnapshot(
        pod.address,
        waiting,
        pod.running,
        pod.kv_cache_usage,
        pod.max_lora,
        pod.running_adapters,
        pod.waiting_adapters,
        pod.updated_at,
        pod.healthy,
        pod.reason,
        pod.field_times,
    )
