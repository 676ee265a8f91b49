"""What the director needs from around it, as small protocols: the snapshot it routes with, and where it
counts its decisions. The Redis-fed source and the Prometheus metrics implement them at the edges; the
quality benchmark and the tests bring their own."""

from __future__ import annotations

from typing import Protocol

from pointsman_shared.snapshot import PoolSnapshot


class SnapshotSource(Protocol):
    def current(self) -> PoolSnapshot | None:
        """The newest snapshot known, without I/O."""


class RoutingMetrics(Protocol):
    def routed(self, model: str, target: str, priority: int, profile: str, result: str) -> None:
        """A request got a destination; ``result`` is the decision's label (picked, picked_stale, ...)."""

    def scheduled(self, seconds: float) -> None:
        """One run of the scheduler took ``seconds``."""

    def decided(self, rewrite: str, objective: str) -> None:
        """A routed request's model entry or rewrite and objective (``config/NAME``, ``cluster/NAME``,
        ``""`` for none)."""

    def plugins_timed(self, steps: list[tuple[str, str, int, float]]) -> None:
        """The plugins of one timed decision: (kind, name, pods kept or scored, seconds) in order."""


class NoMetrics:
    """Counts nothing: for a director whose decisions nobody scrapes."""

    def routed(self, model: str, target: str, priority: int, profile: str, result: str) -> None:
        pass

    def scheduled(self, seconds: float) -> None:
        pass

    def decided(self, rewrite: str, objective: str) -> None:
        pass

    def plugins_timed(self, steps: list[tuple[str, str, int, float]]) -> None:
        pass
