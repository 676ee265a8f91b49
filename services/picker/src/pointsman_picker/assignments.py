"""The picker's own recent assignments, added to what the last snapshot says each pod has waiting.

Snapshots arrive every ~50 ms. Between two, every request sees the same numbers, so a burst would all
land on the one pod that looked idle. Each assignment is remembered with its time; while it is newer
than the pod's last scrape (``updated_at``) and its request has not ended, it counts as one more
waiting request on that pod. Once a snapshot scraped after it arrives, the pod's own numbers include
it and the count is dropped; a request that ends first (its ext_proc stream closes) is dropped then.
Pure: time comes in as arguments.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import replace

from pointsman_picker.scheduling import Pods
from pointsman_shared.snapshot import PodSnapshot


class RecentAssignments:
    def __init__(self) -> None:
        self._times: dict[str, deque[float]] = {}
        # The last adjusted copy per pod: between two snapshots only the picked pod's count changes,
        # so one copy per decision is made instead of one per counted pod.
        self._copies: dict[str, tuple[PodSnapshot, int, PodSnapshot]] = {}

    def record(self, address: str, now: float) -> None:
        times = self._times.get(address)
        if times is None:
            times = self._times[address] = deque()
        times.append(now)

    def release(self, address: str, at: float) -> None:
        """The request assigned at ``at`` has ended: it no longer waits anywhere, scraped or not."""
        times = self._times.get(address)
        if times and at in times:
            times.remove(at)

    def pending(self) -> dict[str, int]:
        """Assignments per pod not yet seen by a scrape (as of the last :meth:`adjust`)."""
        return {address: len(times) for address, times in self._times.items()}

    def adjust(self, pods: Pods, index: Mapping[str, int], *, not_before: float) -> Pods:
        """``pods`` with each one's unseen assignments added to ``waiting``; forgets the seen ones, those
        older than ``not_before`` (a pod whose scrapes stopped must not collect them forever) and pods
        no longer in ``pods``. ``index`` gives each pod's position in ``pods`` by address, so the cost
        follows the pods with assignments, not the pool."""
        if not self._times:
            self._copies = {}
            return pods
        times_of, copies = self._times, self._copies
        self._times, self._copies = {}, {}
        adjusted: list[PodSnapshot] | None = None
        for address, times in times_of.items():
            i = index.get(address)
            if i is None:
                continue
            pod = pods[i]
            seen = max(pod.updated_at, not_before)
            while times and times[0] <= seen:
                times.popleft()
            if not times:
                continue
            self._times[address] = times
            count = len(times)
            copy = copies.get(address)
            if copy is None or copy[0] is not pod or copy[1] != count:
                copy = (pod, count, replace(pod, waiting=pod.waiting + count))
            self._copies[address] = copy
            if adjusted is None:
                adjusted = list(pods)
            adjusted[i] = copy[2]
        return pods if adjusted is None else tuple(adjusted)
