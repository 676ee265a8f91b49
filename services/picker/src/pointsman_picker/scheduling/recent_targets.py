"""How many distinct target models this picker routed lately: how many adapters compete for the pool's
slots, counted from the traffic (a snapshot shows only those with requests in flight at that moment).
Pure: time comes in as arguments."""

from __future__ import annotations

import math
from typing import ClassVar

from pointsman_picker.scheduling.contracts import RequestPlugin
from pointsman_picker.scheduling.types import CycleState, DataKey, Pods, SchedulingRequest

# The distinct target models routed within the window, this request's included.
RECENT_TARGETS: DataKey[int] = DataKey("recent targets")

# Long enough to see the tail of a Zipf mix of adapters at tens of requests a second.
DEFAULT_WINDOW = 30.0


class RecentTargets(RequestPlugin):
    """Counts every request's target at ``prepare`` (dropped ones too: they wanted a slot as well)."""

    type_name: ClassVar[str] = "recent-targets"
    produces = (RECENT_TARGETS,)

    def __init__(self, window: float = DEFAULT_WINDOW) -> None:
        if window <= 0:
            raise ValueError(f"window must be positive, got {window}")
        self._window = window
        self.spec = (self.type_name, repr(window))
        self._last: dict[str | None, float] = {}
        self._pruned = -math.inf

    def prepare(self, request: SchedulingRequest, pods: Pods, state: CycleState, now: float) -> Pods:
        state[RECENT_TARGETS] = self.seen(request.target_model, now)
        return pods

    def seen(self, target: str | None, now: float) -> int:
        """Count ``target`` as routed at ``now``; return the distinct targets within the window."""
        self._last[target] = now
        if now - self._pruned > self._window / 4:  # a pass over the targets now and then, not per request
            horizon = now - self._window
            self._last = {t: at for t, at in self._last.items() if at >= horizon}
            self._pruned = now
        return len(self._last)
