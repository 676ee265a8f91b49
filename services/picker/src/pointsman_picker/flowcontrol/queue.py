"""The waiting requests, in dispatch order: bands by priority (highest first), flows within a band in
turn (round-robin, a flow that has waited goes to the back once served), first come first served
within a flow. Bounds per band and in all, in requests and bytes.

Cancelled entries leave the counts at once and the deques lazily (skipped at the head), so a client
that goes away costs O(1). A flow's entries share their band's time limit and arrive in time order, so
their deadlines are in order too: expiry looks at each flow's head only.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


class Full(Exception):
    """No room to wait: ``scope`` is ``band`` or ``queue``, ``what`` ``requests`` or ``bytes``."""

    def __init__(self, scope: str, what: str, limit: int) -> None:
        super().__init__(f"the {scope} holds its limit of {limit} {what}")
        self.scope = scope
        self.what = what
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Bounds:
    max_requests: int
    max_bytes: int


@dataclass(eq=False, slots=True)
class Entry(Generic[T]):
    """One waiting request: ``item`` is the caller's; ``live`` until dispatched, expired or removed."""

    key: int
    item: T
    priority: int
    flow: str
    size: int
    enqueued: float
    deadline: float
    live: bool = True


@dataclass(slots=True)
class _Band(Generic[T]):
    bounds: Bounds
    flows: OrderedDict[str, deque[Entry[T]]] = field(default_factory=OrderedDict)
    requests: int = 0
    bytes: int = 0


class FlowQueue(Generic[T]):
    def __init__(self, total: Bounds, band_bounds: dict[int, Bounds], default_band: Bounds) -> None:
        self._total = total
        self._band_bounds = band_bounds
        self._default_band = default_band
        self._bands: dict[int, _Band[T]] = {}
        self._order: list[int] = []  # priorities of the bands, highest first
        self._keys = 0
        self.requests = 0
        self.bytes = 0

    def __len__(self) -> int:
        return self.requests

    def push(
        self, item: T, *, priority: int, flow: str, size: int, now: float, ttl: float, force: bool = False
    ) -> Entry[T]:
        """Queue ``item`` at the back of its flow; :class:`Full` when a bound would be passed (unless
        ``force``: an entry moved into a queue with new bounds keeps its place)."""
        band = self._bands.get(priority)
        bounds = band.bounds if band is not None else self._band_bounds.get(priority, self._default_band)
        for scope, limits, requests, size_now in (
            ()
            if force
            else (
                ("queue", self._total, self.requests, self.bytes),
                ("band", bounds, band.requests if band else 0, band.bytes if band else 0),
            )
        ):
            if requests + 1 > limits.max_requests:
                raise Full(scope, "requests", limits.max_requests)
            if size_now + size > limits.max_bytes:
                raise Full(scope, "bytes", limits.max_bytes)
        if band is None:
            band = self._bands[priority] = _Band(bounds)
            self._order = sorted(self._bands, reverse=True)
        self._keys += 1
        entry = Entry(self._keys, item, priority, flow, size, now, now + ttl)
        queue = band.flows.get(flow)
        if queue is None:
            queue = band.flows[flow] = deque()
        queue.append(entry)
        band.requests += 1
        band.bytes += size
        self.requests += 1
        self.bytes += size
        return entry

    def ahead(self, priority: int) -> bool:
        """Whether a request of ``priority`` or higher waits (a new one of ``priority`` goes behind it)."""
        return bool(self._order) and self._order[0] >= priority

    def head(self) -> Entry[T] | None:
        """The entry to dispatch next (not removed)."""
        for priority in self._order:
            band = self._bands[priority]
            for queue in band.flows.values():
                while queue and not queue[0].live:
                    queue.popleft()
                if queue:
                    return queue[0]
        return None

    def pop(self) -> Entry[T] | None:
        """Remove and return :meth:`head`; its flow takes its turn (moves behind the band's others)."""
        entry = self.head()
        if entry is None:
            return None
        band = self._bands[entry.priority]
        queue = band.flows[entry.flow]
        queue.popleft()
        if queue:
            band.flows.move_to_end(entry.flow)
        else:
            del band.flows[entry.flow]
        self._forget(entry)
        return entry

    def scan(self, limit: int) -> list[Entry[T]]:
        """Up to ``limit`` live entries of the highest band, in dispatch order: the first of each flow
        in turn, then the second of each, and so on."""
        for priority in self._order:
            band = self._bands[priority]
            flows = [[e for e in queue if e.live] for queue in band.flows.values()]
            out: list[Entry[T]] = []
            for depth in range(max(map(len, flows), default=0)):
                out += [flow[depth] for flow in flows if depth < len(flow)]
                if len(out) >= limit:
                    return out[:limit]
            if out:
                return out
        return []

    def take(self, entry: Entry[T]) -> None:
        """Remove live ``entry`` to dispatch it, wherever it is in its flow; the flow takes its turn
        (moves behind the band's others)."""
        band = self._bands[entry.priority]
        queue = band.flows[entry.flow]
        self._forget(entry)
        if entry.priority not in self._bands:
            return  # the band emptied, its flows with it
        while queue and not queue[0].live:
            queue.popleft()
        if queue:
            band.flows.move_to_end(entry.flow)
        else:
            del band.flows[entry.flow]

    def remove(self, entry: Entry[T]) -> bool:
        """Take ``entry`` out (its client went away); ``False`` when it no longer waits."""
        if not entry.live:
            return False
        self._forget(entry)
        return True

    def expired(self, now: float) -> list[Entry[T]]:
        """Remove and return every entry whose deadline has passed at ``now``, oldest first per flow."""
        gone: list[Entry[T]] = []
        for band in list(self._bands.values()):
            for flow in list(band.flows):
                queue = band.flows[flow]
                while queue and (not queue[0].live or queue[0].deadline <= now):
                    entry = queue.popleft()
                    if entry.live:
                        self._forget(entry)
                        gone.append(entry)
                if not queue:
                    del band.flows[flow]
        return gone

    def next_deadline(self) -> float | None:
        """The earliest deadline of a live entry (each flow's first live one), if any waits."""
        best: float | None = None
        for band in self._bands.values():
            for queue in band.flows.values():
                first = next((e for e in queue if e.live), None)
                if first is not None and (best is None or first.deadline < best):
                    best = first.deadline
        return best

    def drain(self) -> list[Entry[T]]:
        """Remove and return every live entry, in dispatch order."""
        out = []
        while (entry := self.pop()) is not None:
            out.append(entry)
        return out

    def sizes(self) -> Iterator[tuple[int, str, int, int]]:
        """``(priority, flow, requests, bytes)`` of every flow with a live entry."""
        for priority, band in self._bands.items():
            for flow, queue in band.flows.items():
                live = [e for e in queue if e.live]
                if live:
                    yield priority, flow, len(live), sum(e.size for e in live)

    def _forget(self, entry: Entry[T]) -> None:
        entry.live = False
        band = self._bands[entry.priority]
        band.requests -= 1
        band.bytes -= entry.size
        self.requests -= 1
        self.bytes -= entry.size
        if not band.requests:
            # An empty band leaves the order (its dead entries with it).
            del self._bands[entry.priority]
            self._order.remove(entry.priority)
