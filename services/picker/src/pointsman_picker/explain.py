"""The path one decision took through a profile's plugins, for the debug header, DEBUG logs and the
per-plugin duration metric.

One line, ASCII, fit for an HTTP header. Filters show how many pods they kept, scorers the score they
gave the picked pod (clamped, before their weight, which follows ``*``), the picker how many it chose
from:
``pods=3 (+2 recent); critical request:3 > low queueing:2 > LoRA soft affinity:0 > least queuing:1 >
least KV cache:1 > random-picker:1; picked 10.0.0.2:8000`` or ``pods=3; queue-scorer*2=1.00 >
kv-cache-scorer*2=0.71 > max-score-picker:3; picked 10.0.0.2:8000`` (``stale`` is added when only
stale pods were left; the request plugins' notes, such as ``+2 recent``, follow the pod count).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pointsman_picker.scheduling import Pods
from pointsman_shared.snapshot import PodSnapshot

FILTER, SCORER, PICKER = "filter", "scorer", "picker"


class DecisionTrace:
    """A :class:`~pointsman_picker.scheduling.profiles.Trace` that also notes when each step ended."""

    def __init__(self, timer: Callable[[], float]) -> None:
        self._timer = timer
        self._last = timer()
        self.steps: list[tuple[str, str, int, float]] = []  # kind, name, pods kept or scored, seconds
        self._scores: list[tuple[str, float, Sequence[float]]] = []
        self._picked: int | None = None  # the chosen pod's position among those scored

    def _step(self, kind: str, name: str, pods: int) -> None:
        now = self._timer()
        self.steps.append((kind, name, pods, now - self._last))
        self._last = now

    def __call__(self, name: str, kept: int) -> None:
        self._step(FILTER, name, kept)

    def scored(self, name: str, weight: float, scores: Sequence[float]) -> None:
        self._step(SCORER, name, len(scores))
        self._scores.append((name, weight, scores))

    def chose(self, name: str, pods: Pods, pod: PodSnapshot) -> None:
        self._step(PICKER, name, len(pods))
        self._picked = next((i for i, p in enumerate(pods) if p is pod), None)

    def describe(self, *, pods: int, notes: Sequence[str], stale: bool, outcome: str) -> str:
        head = f"pods={pods}" + "".join(f" ({note})" for note in notes) + (" stale" if stale else "")
        scores = iter(self._scores)
        parts = []
        for kind, name, kept, _ in self.steps:
            if kind == SCORER:
                _, weight, values = next(scores)
                score = values[self._picked] if self._picked is not None and values else 0.0
                parts.append(f"{name}*{weight:g}={score:.2f}")
            else:
                parts.append(f"{name}:{kept}")
        return f"{head}; {' > '.join(parts)}; {outcome}"
