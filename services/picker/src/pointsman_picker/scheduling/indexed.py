"""A pool's pods carrying what the filters ask of every pod, worked out once per snapshot.

A snapshot serves every decision for ~50 ms, and at 512 pods one Python pass over the pool costs
about as much as a whole decision may. :class:`IndexedPods` is a tuple of pods like any other, so
every filter takes it. Filters read pods through :func:`facts_of`: the :class:`IndexedFacts` of indexed
pods (the waiting, KV-cache and load columns and their ranges, per-target LoRA groups, capacity
masks...), the plain view's pass for any other tuple. Each fact is worked out when first asked for and
then kept with the pool's pods, which serve every decision until the next snapshot. The picker adds
its own recent assignments to ``waiting`` before each decision: :func:`with_waiting` makes those pods
and carries the facts over, updated at the changed positions only.

What a filter keeps is a plain tuple (or the pods themselves, when it keeps them all): a subset is new
with every decision, and working out its facts would cost the pass they save (a compress of the
pool's columns is no cheaper than a pass over a subset of a quarter of the pool).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import compress
from operator import itemgetter
from typing import Any

from pointsman_picker.scheduling.contracts import LoraGroups, PodFacts
from pointsman_picker.scheduling.facts import PLAIN, PlainFacts
from pointsman_picker.scheduling.types import Pods
from pointsman_shared.snapshot import PodSnapshot, replace_waiting

SMALL = 16  # below this many pods, plain passes beat the facts' bookkeeping


class _Columns:
    """What ``waiting`` does not change: shared by the copies :func:`with_waiting` makes."""

    __slots__ = ("copies", "kv", "kv_range", "lora", "slots", "starved")

    def __init__(self) -> None:
        self.kv: list[float] | None = None
        self.kv_range: tuple[float, float] | None = None
        self.lora: dict[str | None, LoraGroups] = {}
        self.slots: int | None = None
        self.starved: bool | None = None
        # The pod at a position with another waiting, by (position, waiting): counts go up and down
        # by one as requests are assigned and end, and a copy costs more than the rest of with_waiting.
        self.copies: dict[tuple[int, int], PodSnapshot] = {}


class _Positions(tuple[int, ...]):
    """Positions among ``n`` pods, with what takes the items at them (the pods, or a column of theirs):
    an itemgetter, whose cost follows the items taken, not the pool."""

    take: Callable[[Sequence[Any]], tuple[Any, ...]]

    def __new__(cls, positions: Sequence[int], n: int) -> _Positions:
        self = super().__new__(cls, positions)
        if not positions:
            self.take = lambda items: ()
        elif len(positions) == n:
            self.take = tuple  # all of them, in order
        elif len(positions) == 1:
            position = positions[0]
            self.take = lambda items: (items[position],)
        else:
            self.take = itemgetter(*positions)
        return self


class IndexedFacts(PlainFacts):
    """The facts of one :class:`IndexedPods`: the plain view's answers, kept."""

    __slots__ = ("_capacity", "_high", "_load", "_low", "_total_load", "_waiting", "columns")

    def __init__(self, columns: _Columns) -> None:
        self.columns = columns
        self._waiting: list[int] | None = None
        # The fewest and the most waiting, each worked out when asked: low queueing asks only the most,
        # and the picker's assignments, which go to the least loaded pods, move the fewest often.
        self._low: int | None = None
        self._high: int | None = None
        self._capacity: dict[tuple[int, float], bytearray] = {}
        self._load: list[int] | None = None
        self._total_load: int | None = None

    def waiting(self, pods: Pods) -> list[int]:
        if self._waiting is None:
            self._waiting = super().waiting(pods)
        return self._waiting

    def max_waiting(self, pods: Pods) -> int:
        if self._high is None:
            self._high = max(self.waiting(pods)) if pods else 0
        return self._high

    def waiting_range(self, pods: Pods) -> tuple[int, int]:
        if not pods:
            return 0, 0
        if self._low is None:
            self._low = min(self.waiting(pods))
        return self._low, self.max_waiting(pods)

    def waiting_at_most(self, pods: Pods, limit: int) -> Pods:
        return tuple(compress(pods, [q <= limit for q in self.waiting(pods)]))

    def kv(self, pods: Pods) -> list[float]:
        columns = self.columns
        if columns.kv is None:
            columns.kv = super().kv(pods)
        return columns.kv

    def kv_range(self, pods: Pods) -> tuple[float, float]:
        columns = self.columns
        if columns.kv_range is None:
            usage = self.kv(pods)
            columns.kv_range = (min(usage), max(usage)) if usage else (0.0, 0.0)
        return columns.kv_range

    def kv_at_most(self, pods: Pods, limit: float) -> Pods:
        return tuple(compress(pods, [u <= limit for u in self.kv(pods)]))

    def capacity(self, pods: Pods, queue: int, kv: float) -> Pods:
        mask = self._capacity.get((queue, kv))
        if mask is None:
            mask = self._capacity[(queue, kv)] = bytearray(
                [w <= queue and u <= kv for w, u in zip(self.waiting(pods), self.kv(pods), strict=True)]
            )
        return tuple(compress(pods, mask))

    def lora(self, pods: Pods, target: str | None) -> LoraGroups:
        groups = self.columns.lora.get(target)
        if groups is None:
            near, free = super().lora(pods, target)
            groups = self.columns.lora[target] = (_Positions(near, len(pods)), _Positions(free, len(pods)))
        return groups

    def take(self, pods: Pods, positions: Sequence[int]) -> Pods:
        if isinstance(positions, _Positions):
            return positions.take(pods)
        return super().take(pods, positions)

    def least_load(self, pods: Pods, positions: Sequence[int]) -> int:
        if isinstance(positions, _Positions):
            least: int = min(positions.take(self._load_column(pods)))
            return least
        return super().least_load(pods, positions)

    def total_load(self, pods: Pods) -> int:
        if self._total_load is None:
            self._total_load = sum(self._load_column(pods))
        return self._total_load

    def _load_column(self, pods: Pods) -> list[int]:
        if self._load is None:
            self._load = [pod.running + pod.waiting for pod in pods]
        return self._load

    def slots(self, pods: Pods) -> int:
        columns = self.columns
        if columns.slots is None:
            columns.slots = super().slots(pods)
        return columns.slots

    def starved(self, pods: Pods) -> bool:
        columns = self.columns
        if columns.starved is None:
            columns.starved = super().starved(pods)
        return columns.starved

    def changed(self, pods: Pods, waiting: Mapping[int, int]) -> IndexedFacts:
        """The facts of ``pods`` with ``waiting`` changed at some positions (at least one)."""
        facts = IndexedFacts(self.columns)
        if self._waiting is not None:
            column = self._waiting.copy()
            low, high = self._low, self._high
            for i, n in waiting.items():
                # An end may have moved inwards: found again when asked for.
                if high is not None and n < column[i] == high:
                    high = None
                if low is not None and n > column[i] == low:
                    low = None
                column[i] = n
            facts._waiting = column
            facts._high = None if high is None else max(high, *waiting.values())
            facts._low = None if low is None else min(low, *waiting.values())
            if self._capacity:
                kv = self.kv(pods)
                for (queue, kv_limit), old in self._capacity.items():
                    mask = old.copy()
                    for i, n in waiting.items():
                        mask[i] = n <= queue and kv[i] <= kv_limit
                    facts._capacity[(queue, kv_limit)] = mask
        if self._load is not None:
            load = self._load.copy()
            for i, n in waiting.items():
                load[i] = pods[i].running + n
            facts._load = load
        if self._total_load is not None:
            facts._total_load = self._total_load + sum([n - pods[i].waiting for i, n in waiting.items()])
        return facts


class IndexedPods(tuple[PodSnapshot, ...]):
    """Pods (a tuple) carrying their :class:`IndexedFacts`."""

    facts: IndexedFacts

    def __new__(cls, pods: Iterable[PodSnapshot], facts: IndexedFacts | None = None) -> IndexedPods:
        self = super().__new__(cls, pods)
        self.facts = facts if facts is not None else IndexedFacts(_Columns())
        return self


def indexed(pods: Pods) -> Pods:
    """``pods`` indexed, unless a pass over them costs less than keeping their facts."""
    return pods if isinstance(pods, IndexedPods) or len(pods) < SMALL else IndexedPods(pods)


def facts_of(pods: Pods) -> PodFacts:
    """The view filters read ``pods`` through: their own facts when they carry them."""
    return pods.facts if isinstance(pods, IndexedPods) else PLAIN


def with_waiting(pods: Pods, waiting: Mapping[int, int]) -> Pods:
    """``pods`` with the pod at each position of ``waiting`` replaced by a copy with that ``waiting``;
    facts carried over when ``pods`` has them."""
    if not waiting:
        return pods
    items = list(pods)
    if not isinstance(pods, IndexedPods):
        for i, n in waiting.items():
            items[i] = replace_waiting(items[i], n)
        return tuple(items)
    copies = pods.facts.columns.copies
    for i, n in waiting.items():
        copy = copies.get((i, n))
        if copy is None:
            copy = copies[(i, n)] = replace_waiting(items[i], n)
        items[i] = copy
    return IndexedPods(items, pods.facts.changed(pods, waiting))
