"""A request on its way through the director: what the ext_proc stream knows of it
(:class:`RequestContext`), and what resolving it made of that (:class:`Resolved`)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from pointsman_picker.resolution import Resolution
from pointsman_picker.scheduling import SchedulingRequest

NO_HEADERS: Mapping[str, str] = MappingProxyType({})


class RequestContext(NamedTuple):
    """One request as the ext_proc stream hands it over once its body is complete. ``headers`` are the
    request's, by lower-case name; ``body`` is ``None`` for a request without one (routed without a
    model); ``objective`` is the InferenceObjective its header names; ``explain`` asks for the path
    the decision took."""

    request_id: str
    body: bytes | None
    headers: Mapping[str, str] = NO_HEADERS
    objective: str | None = None
    explain: bool = False


class Resolved(NamedTuple):
    """A request whose model is resolved: what to schedule, what to forward and how to count it.

    ``model`` and ``target`` are metric labels (bounded: a model passed through as asked is ``other``
    past the first few hundred names); ``forward`` is the body to send on (rewritten when the target
    model differs); ``resolution`` is ``None`` for a request without a body."""

    context: RequestContext
    request: SchedulingRequest
    forward: bytes | None
    rewritten: bool
    model: str
    target: str
    priority: int
    resolution: Resolution | None
