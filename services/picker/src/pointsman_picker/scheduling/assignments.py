"""The picker's own recent assignments, added to what the last snapshot says each pod has waiting.

Snapshots arrive every ~50 ms. Between two, every request sees the same numbers, so a burst would all
land on the one pod that looked idle. Each assignment is remembered with its time; while it is newer
than the pod's last scrape (``updated_at``) and its request has not ended, it counts as one more
waiting request on that pod. Once a snapshot scraped after it arrives, the pod's own numbers include
it and the count is dropped; a request that ends first (its ext_proc stream closes) is dropped then.
Pure: time comes in as arguments.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

from pointsman_picker.scheduling.contracts import RequestPlugin, Ticket
from pointsman_picker.scheduling.indexed import with_waiting
from pointsman_picker.scheduling.types import CycleState, DataKey, Pods, SchedulingRequest

# Given by the director before the plugins prepare: each candidate pod's position by address.
POSITIONS: DataKey[Mapping[str, int]] = DataKey("pod positions")


class RecentAssignments(RequestPlugin):
    """The assignments of the last ``horizon`` seconds (``picker.maxStaleness``: older ones are
    forgotten, so a pod whose scrapes stopped does not collect them forever), as a lifecycle plugin:
    ``prepare`` adds them to the pods' ``waiting``, ``picked`` records one, ``finished`` drops it."""

    type_name: ClassVar[str] = "recent-assignments"
    consumes = (POSITIONS,)

    def __init__(self, horizon: float) -> None:
        if horizon <= 0:
            raise ValueError(f"horizon must be positive, got {horizon}")
        self.horizon = horizon
        self.spec = (self.type_name, repr(horizon))
        # Per pod, the unseen assignments' times by ticket key, oldest first (tickets come in time order).
        self._times: dict[str, dict[int, float]] = {}
        # Between two snapshots a decision changes one pod's count, so :meth:`adjust` starts from its
        # last result and looks only at the pods recorded or released since, until the snapshot changes
        # or an assignment may have passed the horizon (none is older than ``_oldest``).
        self._dirty: set[str] = set()
        self._oldest = math.inf
        self._pods: Pods | None = None  # the last adjust's snapshot pods
        self._adjusted: Pods = ()  # and its result
        self._counts: dict[str, int] = {}  # the counts in that result

    def prepare(self, request: SchedulingRequest, pods: Pods, state: CycleState, now: float) -> Pods:
        return self.adjust(pods, state[POSITIONS], not_before=now - self.horizon)

    def picked(self, ticket: Ticket, request: SchedulingRequest, state: CycleState) -> None:
        self.record(ticket)

    def finished(self, ticket: Ticket) -> None:
        """The request has ended: it no longer waits anywhere, scraped or not."""
        times = self._times.get(ticket.address)
        if times and times.pop(ticket.key, None) is not None:
            self._dirty.add(ticket.address)

    def note(self, state: CycleState) -> str:
        unseen = sum(self._counts.values())  # as of this request's prepare
        return f"+{unseen} recent" if unseen else ""

    def record(self, ticket: Ticket) -> None:
        times = self._times.get(ticket.address)
        if times is None:
            times = self._times[ticket.address] = {}
        times[ticket.key] = ticket.at
        self._dirty.add(ticket.address)
        self._oldest = min(self._oldest, ticket.at)

    def unseen(self) -> dict[str, list[float]]:
        """The remembered assignments' times per pod (those a scrape has shown included, until the next
        :meth:`adjust` forgets them): what a picker tells its peers."""
        return {address: list(times.values()) for address, times in self._times.items() if times}

    def pending(self) -> dict[str, int]:
        """Assignments per pod not yet seen by a scrape (as of the last :meth:`adjust`)."""
        return dict(self._counts)

    def adjust(self, pods: Pods, index: Mapping[str, int], *, not_before: float) -> Pods:
        """``pods`` with each one's unseen assignments added to ``waiting``; forgets the seen ones, those
        older than ``not_before`` (a pod whose scrapes stopped must not collect them forever) and pods
        no longer in ``pods``. ``index`` gives each pod's position in ``pods`` by address, so the cost
        follows the pods with assignments, not the pool."""
        incremental = pods is self._pods and not_before < self._oldest
        if incremental:
            addresses = list(self._dirty)
        else:
            self._pods, self._adjusted, self._counts = pods, pods, {}
            addresses = list(self._times)
        self._dirty = set()
        changes: dict[int, int] = {}
        for address in addresses:
            times = self._times.get(address)
            i = index.get(address)
            if times is None or i is None:
                self._times.pop(address, None)
                continue
            pod = pods[i]
            seen = max(pod.updated_at, not_before)
            while times:
                first = next(iter(times))
                if times[first] >= seen:  # one at the scrape instant (virtual time) is not in it
                    break
                del times[first]
            count = len(times)
            if not count:
                del self._times[address]
            if count != self._counts.get(address, 0):
                changes[i] = pod.waiting + count
                if count:
                    self._counts[address] = count
                else:
                    del self._counts[address]
        if not incremental:
            self._oldest = min(
                (next(iter(times.values())) for times in self._times.values()), default=math.inf
            )
        self._adjusted = with_waiting(self._adjusted, changes)
        return self._adjusted
