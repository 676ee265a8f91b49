"""The pace of dispatch from the queue: a token bucket, so that held requests leave over the next
milliseconds when room appears, not all in one instant.

Requests released together land on the pods together (the detector sees the pool's load only through
snapshots and this picker's own count), and in the overload mix they then wait in the pods' queues
for an adapter slot, with the Critical requests behind them (bench/results/overload.md). One slot per
``interval``, at most ``burst`` saved up.

Pure: time comes in as arguments.
"""

from __future__ import annotations


class Pace:
    def __init__(self, interval: float, burst: int) -> None:
        """``interval`` 0: no pace (every :meth:`take` succeeds)."""
        if interval < 0 or burst < 1:
            raise ValueError(f"interval must be >= 0 and burst >= 1, got {interval}, {burst}")
        self.interval = interval
        self.burst = burst
        self._tokens = float(burst)
        self._at: float | None = None  # when ``_tokens`` was last brought up to date

    @property
    def paced(self) -> bool:
        return self.interval > 0

    def ready(self, now: float, share: int = 1) -> bool:
        """Whether a request may leave at ``now``; ``share``: how many pickers pace the same pool
        (each one then gets a slot every ``share`` intervals)."""
        return not self.paced or self._refill(now, share) >= 1.0

    def take(self, now: float, share: int = 1) -> None:
        """A request left at ``now`` (after :meth:`ready`)."""
        if self.paced:
            self._tokens = max(self._refill(now, share) - 1.0, 0.0)

    def next_slot(self, now: float, share: int = 1) -> float:
        """When the next request may leave (``now`` when one may now)."""
        tokens = self._refill(now, share) if self.paced else 1.0
        if tokens >= 1.0:
            return now
        return now + (1.0 - tokens) * self.interval * max(share, 1)

    def _refill(self, now: float, share: int) -> float:
        at = self._at
        if at is not None and now > at:
            self._tokens = min(self._tokens + (now - at) / (self.interval * max(share, 1)), self.burst)
        if at is None or now > at:
            self._at = now
        return self._tokens
