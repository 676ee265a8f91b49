"""What the scheduling core takes and returns."""

from __future__ import annotations

from dataclasses import dataclass

from pointsman_shared.snapshot import PodSnapshot

Pods = tuple[PodSnapshot, ...]


@dataclass(frozen=True, slots=True)
class SchedulingRequest:
    """``target_model`` is the resolved model (the LoRA adapter to look for); ``None`` when the request
    names no model (e.g. a GET without a body)."""

    target_model: str | None
    critical: bool


@dataclass(frozen=True, slots=True)
class NoCapacity:
    """The request was dropped: no pod can take it (a sheddable request under load)."""

    reason: str
