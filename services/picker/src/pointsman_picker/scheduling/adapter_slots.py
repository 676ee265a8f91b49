"""What a snapshot does not show of the pods' adapter slots, from this picker's own picks.

- The adapters this picker sent to a pod since its last scrape (``UNSEEN_ADAPTERS``): snapshots come
  every ~50 ms and every request between two sees the same adapters, so without these a burst could
  hand one free slot to several adapters (each new one then waits until another has no request left,
  seconds under steady traffic), and the next request of an adapter just sent somewhere would not find
  it there.
- Where the request's adapter probably still sits in a GPU slot with no request there (``RESIDENT``):
  a snapshot shows only the adapters with requests running or waiting (vLLM's ``lora_requests_info``),
  but an idle adapter stays in its slot until a new adapter needs one and it is the least recently
  used idle one. A request sent there runs without loading it (~0.1 s from disk).

Counted from this picker's own picks: per pod, the adapters it sent there, most recent last. The target
is probably still in a slot of a pod it was sent to while the adapters sent there after it, together
with those active there now, need fewer slots than the pod has. A target counts as an adapter once a
snapshot has shown it active on some pod (the base model never is: it takes no slot). Pure: no clock.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

from pointsman_picker.scheduling.assignments import POSITIONS
from pointsman_picker.scheduling.contracts import RequestPlugin, Ticket
from pointsman_picker.scheduling.indexed import facts_of
from pointsman_picker.scheduling.types import CycleState, DataKey, Pods, SchedulingRequest

# The addresses of the pods where the request's target adapter is probably in a slot though it is not
# active there (not written when there is none).
RESIDENT: DataKey[frozenset[str]] = DataKey("adapter resident")

# Per pod (by address), the adapters this picker sent there after its last scrape that the scrape does
# not show active (not written when there is none).
UNSEEN_ADAPTERS: DataKey[Mapping[str, frozenset[str]]] = DataKey("unseen adapters")

# Seconds after a pick within which its request has surely not ended yet (a scrape that does not show
# its target active on the pod then shows that the target takes no slot: the base model).
SURELY_RUNNING = 0.2

# Adapters remembered per pod: far more than any pod's slots, so the order is known as deep as it counts.
DEFAULT_DEPTH = 64

# Targets taken for base models, remembered at most (the oldest forgotten first): with
# ``passthroughUnknownModels`` a client can name any model, and each named one would stay otherwise.
MAX_BASE_TARGETS = 4096


class AdapterSlots(RequestPlugin):
    """Records each pick's adapter per pod at ``picked``; writes ``RESIDENT`` at ``prepare``."""

    type_name: ClassVar[str] = "adapter-slots"
    produces = (RESIDENT, UNSEEN_ADAPTERS)
    consumes = (POSITIONS,)

    def __init__(self, depth: int = DEFAULT_DEPTH, horizon: float = 2.0) -> None:
        """``horizon``: picks older than this are taken as scraped (a pod whose scrapes stopped)."""
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        if horizon <= 0:
            raise ValueError(f"horizon must be positive, got {horizon}")
        self._depth = depth
        self._horizon = horizon
        self.spec = (self.type_name, f"{depth!r}, {horizon!r}")
        # Per pod, each adapter sent there since its last scrape, with the time of its latest pick; the
        # pods picked since the last prepare; the unseen adapters as the filters get them. A prepare
        # looks again at every pod only when the snapshot changed (a new positions map) or a pick may
        # have passed the horizon; otherwise at the pods picked since.
        self._recent: dict[str, dict[str, float]] = {}
        self._dirty: set[str] = set()
        self._unseen: dict[str, frozenset[str]] = {}
        self._positions: Mapping[str, int] | None = None
        self._checked = -math.inf
        self._sent: dict[str, OrderedDict[str, None]] = {}  # per pod, its adapters, most recent last
        self._homes: dict[str, set[str]] = {}  # per adapter, the pods whose order holds it
        self._adapters: set[str] = set()  # the targets seen active on a pod
        # Targets a scrape soon after their pick did not show there, oldest first.
        self._base: OrderedDict[str, None] = OrderedDict()
        self._pool: Mapping[str, int] | None = None  # the positions _sent was last pruned against

    def prepare(self, request: SchedulingRequest, pods: Pods, state: CycleState, now: float) -> Pods:
        positions = state[POSITIONS]
        if positions is not self._pool:
            self._forget_gone(positions)
        if self._recent:
            self.update(pods, positions, now)
            if self._unseen:
                state[UNSEEN_ADAPTERS] = MappingProxyType(self._unseen)
        target = request.target_model
        if target is None or facts_of(pods).lora(pods, target)[0]:
            if target is not None and target not in self._adapters:
                self._adapters.add(target)
                self._base.pop(target, None)
            return pods  # active somewhere (or no adapter): where it sits idle does not matter
        homes = self._homes.get(target) if target in self._adapters else None
        if homes:
            resident = self.resident(target, homes, pods, positions)
            if resident:
                state[RESIDENT] = resident
        return pods

    def update(self, pods: Pods, positions: Mapping[str, int], now: float) -> None:
        """Bring the unseen adapters up to date: forget the picks a scrape has seen (one at the scrape's
        instant is not in it) or older than the horizon, and the adapters the scrape shows active."""
        full = positions is not self._positions or now - self._checked > self._horizon / 4
        addresses = list(self._recent) if full else [a for a in self._dirty if a in self._recent]
        if full:
            self._positions, self._checked = positions, now
        self._dirty.clear()
        horizon = now - self._horizon
        for address in addresses:
            recent = self._recent[address]
            i = positions.get(address)
            if i is None:
                del self._recent[address]
                self._unseen.pop(address, None)
                continue
            pod = pods[i]
            seen = max(pod.updated_at, horizon)
            active = pod.active_adapters
            for target, at in list(recent.items()):
                if at >= seen:
                    continue
                del recent[target]
                # Scraped while it surely still ran there, yet not active: the base model.
                if (
                    pod.updated_at - at < SURELY_RUNNING
                    and target not in active
                    and target not in self._adapters
                ):
                    self._base[target] = None
                    if len(self._base) > MAX_BASE_TARGETS:
                        self._base.popitem(last=False)
            adapters = frozenset([a for a in recent if a not in self._base]) - active
            if not recent:
                del self._recent[address]
            if adapters:
                self._unseen[address] = adapters
            else:
                self._unseen.pop(address, None)

    def _forget_gone(self, positions: Mapping[str, int]) -> None:
        """Drop the order of the pods no longer among the candidates (left the pool, or stale): an
        address that comes back starts with nothing known of its slots."""
        self._pool = positions
        for address in [a for a in self._sent if a not in positions]:
            for adapter in self._sent.pop(address):
                homes = self._homes.get(adapter)
                if homes is not None:
                    homes.discard(address)
                    if not homes:
                        del self._homes[adapter]

    def resident(
        self, target: str, homes: set[str], pods: Pods, positions: Mapping[str, int]
    ) -> frozenset[str]:
        """Of ``homes``, the pods where ``target`` is not active and probably still holds a slot."""
        kept = []
        for address in homes:
            i = positions.get(address)
            if i is None:
                continue
            pod = pods[i]
            active = pod.active_adapters
            if target in active:
                continue  # the snapshot says so already
            # The slots wanted since: every adapter active now, and those sent after the target (each
            # took a slot when it was admitted, evicting the least recently used idle one).
            wanted = set(active)
            for adapter in reversed(self._sent[address]):
                if adapter == target or len(wanted) >= pod.max_lora:
                    break
                if adapter not in self._base:
                    wanted.add(adapter)
            if len(wanted) < pod.max_lora:
                kept.append(address)
        return frozenset(kept)

    def picked(self, ticket: Ticket, request: SchedulingRequest, state: CycleState) -> None:
        target = request.target_model
        if target is None:
            return
        if target in self._base:
            return
        recent = self._recent.get(ticket.address)
        if recent is None:
            recent = self._recent[ticket.address] = {}
        recent[target] = ticket.at
        self._dirty.add(ticket.address)
        sent = self._sent.get(ticket.address)
        if sent is None:
            sent = self._sent[ticket.address] = OrderedDict()
        sent[target] = None
        sent.move_to_end(target)
        self._homes.setdefault(target, set()).add(ticket.address)
        if len(sent) > self._depth:
            oldest, _ = sent.popitem(last=False)
            homes = self._homes[oldest]
            homes.discard(ticket.address)
            if not homes:
                del self._homes[oldest]
