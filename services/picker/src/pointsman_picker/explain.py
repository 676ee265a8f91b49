"""The path one decision took through the filters, for the debug header, DEBUG logs and the per-filter
duration metric.

One line, ASCII, fit for an HTTP header:
``pods=3 (+2 recent); critical request:3 > low queueing:2 > LoRA soft affinity:0 > least queuing:1 >
least KV cache:1; picked 10.0.0.2:8000`` (``stale`` is added when only stale pods were left).
"""

from __future__ import annotations

from collections.abc import Callable


class DecisionTrace:
    """A :data:`~pointsman_picker.scheduling.StepSink` that also notes when each step ended."""

    def __init__(self, timer: Callable[[], float]) -> None:
        self._timer = timer
        self._last = timer()
        self.steps: list[tuple[str, int, float]] = []  # name, pods kept, seconds spent

    def __call__(self, name: str, kept: int) -> None:
        now = self._timer()
        self.steps.append((name, kept, now - self._last))
        self._last = now

    def describe(self, *, pods: int, recent: int, stale: bool, outcome: str) -> str:
        head = f"pods={pods}" + (f" (+{recent} recent)" if recent else "") + (" stale" if stale else "")
        path = " > ".join(f"{name}:{kept}" for name, kept, _ in self.steps)
        return f"{head}; {path}; {outcome}"
