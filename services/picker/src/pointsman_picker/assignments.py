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
from collections import deque
from collections.abc import Mapping

from pointsman_picker.scheduling import Pods
from pointsman_picker.scheduling.indexed import with_waiting


class RecentAssignments:
    def __init__(self) -> None:
        self._times: dict[str, deque[float]] = {}
        # Between two snapshots a decision changes one pod's count, so :meth:`adjust` starts from its
        # last result and looks only at the pods recorded or released since, until the snapshot changes
        # or an assignment may have passed the horizon (none is older than ``_oldest``).
        self._dirty: set[str] = set()
        self._oldest = math.inf
        self._pods: Pods | None = None  # the last adjust's snapshot pods
        self._adjusted: Pods = ()  # and its result
        self._counts: dict[str, int] = {}  # the counts in that result

    def record(self, address: str, now: float) -> None:
        times = self._times.get(address)
        if times is None:
            times = self._times[address] = deque()
        times.append(now)
        self._dirty.add(address)
        self._oldest = min(self._oldest, now)

    def release(self, address: str, at: float) -> None:
        """The request assigned at ``at`` has ended: it no longer waits anywhere, scraped or not."""
        times = self._times.get(address)
        if times and at in times:
            times.remove(at)
            self._dirty.add(address)

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
            while times and times[0] <= seen:
                times.popleft()
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
            self._oldest = min((times[0] for times in self._times.values()), default=math.inf)
        self._adjusted = with_waiting(self._adjusted, changes)
        return self._adjusted


class PrefillBacklog:
    """The prompt tokens each pod probably still has to compute from this picker's assignments.

    A leaky bucket per pod: each assignment adds its prompt tokens, and the level drains at
    ``tokens_per_second`` (how fast a pod computes prompts while it also decodes). Scrapes say how many
    requests wait, not how long their prompts are, and a long prompt takes several engine steps, so
    this is counted apart from the scraped numbers and outlives them. Pure: time comes in as arguments.
    """

    def __init__(self, tokens_per_second: float) -> None:
        if tokens_per_second <= 0:
            raise ValueError(f"tokens_per_second must be positive, got {tokens_per_second}")
        self._rate = tokens_per_second
        self._levels: dict[str, tuple[float, float]] = {}  # address -> (tokens, as of)

    def record(self, address: str, tokens: int, now: float) -> None:
        if tokens <= 0:
            return
        self._levels[address] = (self._level(address, now) + tokens, now)

    def _level(self, address: str, now: float) -> float:
        entry = self._levels.get(address)
        if entry is None:
            return 0.0
        tokens, at = entry
        return max(0.0, tokens - self._rate * max(0.0, now - at))

    def pending(self, now: float) -> dict[str, float]:
        """The pods with tokens left at ``now``, and how many; forgets the drained ones."""
        out: dict[str, float] = {}
        drained = []
        for address in self._levels:
            level = self._level(address, now)
            if level > 0:
                out[address] = level
            else:
                drained.append(address)
        for address in drained:
            del self._levels[address]
        return out


class RecentTargets:
    """How many distinct target models this picker routed within the last ``window`` seconds: how many
    adapters compete for the pool's slots, counted from the traffic (a snapshot shows only those with
    requests in flight at that moment). Pure: time comes in as arguments."""

    def __init__(self, window: float) -> None:
        if window <= 0:
            raise ValueError(f"window must be positive, got {window}")
        self._window = window
        self._last: dict[str | None, float] = {}
        self._pruned = -math.inf

    def seen(self, target: str | None, now: float) -> int:
        """Count ``target`` as routed at ``now``; return the distinct targets within the window."""
        self._last[target] = now
        if now - self._pruned > self._window / 4:  # a pass over the targets now and then, not per request
            horizon = now - self._window
            self._last = {t: at for t, at in self._last.items() if at >= horizon}
            self._pruned = now
        return len(self._last)
