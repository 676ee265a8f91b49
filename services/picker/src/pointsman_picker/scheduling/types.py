"""What the scheduling core takes and returns: the request, the pods, and a dropped request's outcome."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pointsman_shared.snapshot import PodSnapshot

Pods = tuple[PodSnapshot, ...]

NO_PENDING: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class SchedulingRequest:
    """``target_model`` is the resolved model (the LoRA adapter to look for); ``None`` when the request
    names no model (e.g. a GET without a body).

    ``prompt_tokens`` is the request's own prompt, estimated from its body (0: unknown).
    ``pending_prefill`` is, by pod address, the prompt tokens of this picker's recent assignments that
    the pod has probably not computed yet (see :class:`~pointsman_picker.assignments.PrefillBacklog`);
    a pod not in it has none. ``recent_targets`` counts the distinct target models this picker routed
    lately (:class:`~pointsman_picker.assignments.RecentTargets`). The director fills both only for
    profiles that ask for them.
    """

    target_model: str | None
    critical: bool
    prompt_tokens: int = 0
    pending_prefill: Mapping[str, float] = field(default_factory=lambda: NO_PENDING)
    recent_targets: int = 0  # distinct target models routed lately (0: not counted)


@dataclass(frozen=True, slots=True)
class Drop:
    """The request is dropped (no pod can take it): what a profile returns then, and the terminal
    branch of a filter tree that says so."""

    reason: str
