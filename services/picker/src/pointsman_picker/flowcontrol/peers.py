"""The other pickers' dispatches, for the flow controller's ``peers``: what each active-active picker
sent to each pod since that pod's last scrape, and how the room a scrape shows is split between the
pickers that have requests waiting.

Each picker reports, every few milliseconds, its own assignments a scrape has not shown yet (their
times, per pod) and how many requests it holds (:func:`encode`); the I/O edge
(:mod:`pointsman_picker.peer_sync`) passes the reports through Redis. :class:`PeerView` keeps the
newest report of every other picker and gives, per pod, the waiting requests its snapshot does not
show that this picker must count:

- the peers' assignments newer than the pod's scrape (older ones the scrape already counts);
- while other pickers hold requests too, the part of the pod's room that is theirs: the room a scrape
  shows is split evenly between the pickers with requests waiting (this one included), the remainder
  going in turn by a rotation every picker computes alike from the pod's address and scrape time. So
  two pickers that see the same freed slot in the same snapshot do not both dispatch into it, however
  late the other's report arrives. With ``pod_requests`` (the pool's mean), the pool's room under it
  is split alike, the others' part spread over the pods under the mean, and a pod's share is the
  smaller of the two. What a peer has already sent counts if it is more than its share.

A report that has not changed for ``ttl`` (the picker died, or Redis is unreachable) is forgotten: a
picker alone, or cut off, counts its own assignments only, as without sharing.

Pure: time comes in as arguments; the liveness of a report is judged by this picker's clock (when it
last changed), never by the writer's.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import orjson

from pointsman_picker.flowcontrol.saturation import Thresholds, room
from pointsman_shared.snapshot import PodSnapshot

# A report's assignments per pod: the newest this many (more than any pod's room).
MAX_TIMES = 256
MAX_REPORT_BYTES = 1 << 20  # a larger value in the hash is not a report


@dataclass(frozen=True, slots=True)
class Report:
    """One picker's: its assignments not yet scraped (times per pod address) and its waiting requests."""

    sequence: int
    waiting: int
    dispatches: Mapping[str, Sequence[float]]


def encode(sequence: int, waiting: int, dispatches: Mapping[str, Iterable[float]]) -> bytes:
    """A report as stored; ``sequence`` grows with every report, so a live picker's value changes."""
    pods = {}
    for address, times in dispatches.items():
        kept = sorted(times)[-MAX_TIMES:]
        if kept:
            pods[address] = [round(t, 6) for t in kept]
    return orjson.dumps({"s": sequence, "w": waiting, "p": pods})


def decode(blob: bytes) -> Report:
    """``ValueError`` for a value that is not a report."""
    if len(blob) > MAX_REPORT_BYTES:
        raise ValueError(f"{len(blob)} bytes")
    try:
        doc = orjson.loads(blob)
        pods = doc["p"]
        report = Report(
            int(doc["s"]),
            max(int(doc["w"]), 0),
            {str(a): tuple(float(t) for t in times[-MAX_TIMES:]) for a, times in pods.items()},
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a report: {exc}") from None
    return report


@dataclass(slots=True)
class _Peer:
    report: Report
    changed: float  # this picker's clock when its sequence last changed


class PeerView:
    """The other pickers' newest reports and what they mean for this picker's room (module docstring)."""

    def __init__(self, origin: str, *, ttl: float = 1.0) -> None:
        if ttl <= 0:
            raise ValueError(f"ttl must be positive, got {ttl}")
        self.origin = origin
        self.ttl = ttl
        self._peers: dict[str, _Peer] = {}
        self.generation = 0  # changes whenever what :meth:`extra` answers may change (for caching)

    def update(self, reports: Mapping[str, Report], now: float) -> None:
        """The reports read now, by origin (this picker's own ignored); origins not among them leave."""
        peers: dict[str, _Peer] = {}
        for origin, report in reports.items():
            if origin == self.origin:
                continue
            known = self._peers.get(origin)
            if known is not None and known.report.sequence == report.sequence:
                peers[origin] = known
            else:
                peers[origin] = _Peer(report, now)
        self._peers = peers
        self.generation += 1

    def live(self, now: float) -> dict[str, Report]:
        """The reports that changed within ``ttl``, by origin."""
        return {o: p.report for o, p in self._peers.items() if now - p.changed <= self.ttl}

    def stale(self, now: float, *, after: float) -> list[str]:
        """Origins whose report has not changed for ``after`` seconds (to delete from the hash)."""
        return [o for o, p in self._peers.items() if now - p.changed > after]

    def extra(
        self, pods: Iterable[PodSnapshot], thresholds: Thresholds, now: float, *, horizon: float
    ) -> dict[str, int]:
        """Per pod address, what this picker counts as waiting beyond the snapshot and its own
        assignments: the peers' assignments since the pod's scrape (none older than ``horizon``), or
        the peers' share of the pod's room when that is more."""
        live = self.live(now)
        if not live:
            return {}
        waiting = sorted([self.origin, *(o for o, r in live.items() if r.waiting > 0)])
        me = waiting.index(self.origin)
        k = len(waiting)
        out: dict[str, int] = {}
        not_before = now - horizon
        pods = list(pods)
        under_mean = _mean_shares(pods, thresholds, me, k) if k > 1 else None
        for pod in pods:
            seen = max(pod.updated_at, not_before)
            sent = 0
            for report in live.values():
                times = report.dispatches.get(pod.address)
                if times:
                    sent += sum(1 for t in times if t >= seen)
            theirs = 0
            if k > 1:
                free = room(pod, thresholds)
                theirs = free - _mine(free, me, k, f"{pod.address}|{pod.updated_at!r}")
                if under_mean is not None:
                    # A share counts as waiting requests: one of the queue depth's room alone (far
                    # above the mean) would read as load past every band's mean.
                    theirs = min(theirs, under_mean.get(pod.address, 0))
            count = max(sent, theirs)
            if count:
                out[pod.address] = count
        return out


def _mine(free: int, me: int, k: int, key: str) -> int:
    """This picker's part of ``free`` split between ``k`` pickers: even, the remainder in turn by a
    rotation every picker computes alike from ``key``."""
    turn = (me - zlib.crc32(key.encode()) % k) % k
    return free // k + (1 if turn < free % k else 0)


def _mean_shares(
    pods: Sequence[PodSnapshot], thresholds: Thresholds, me: int, k: int
) -> dict[str, int] | None:
    """With ``pod_requests``, the peers' part of the pool's room under that mean, per pod: the room is
    the pool's (a pod past the mean takes from it), split like a pod's, and what is theirs is spread
    over the pods under the mean by their room there (``None`` without ``pod_requests``)."""
    limit = thresholds.pod_requests
    if limit is None:
        return None
    below = {p.address: limit - p.running - p.waiting for p in pods if p.running + p.waiting < limit}
    pool = limit * len(pods) - sum(p.running + p.waiting for p in pods)
    if pool <= 0 or not below:
        return {}
    newest = max(p.updated_at for p in pods)
    theirs = pool - _mine(pool, me, k, f"pool|{newest!r}")
    total = sum(below.values())  # >= pool: every share is at most its pod's room
    shares = {address: theirs * left // total for address, left in below.items()}
    for address in sorted(below)[: theirs - sum(shares.values())]:  # what the rounding left
        shares[address] += 1
    return shares
