"""The values a request's life produces: the director's :class:`Routing`, and the :class:`Completion`
of a routed request whose response Envoy showed the picker (with the :class:`Usage` read from it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from pointsman_picker.scheduling.contracts import Ticket


class Routing(NamedTuple):
    endpoint: str  # "ip:port"
    body: bytes | None  # what to forward; None for a request without a body
    rewritten: bool
    model: str = ""
    target: str = ""
    explain: str = ""  # the path taken, when asked for (see pointsman_picker.explain)
    priority: int = 0  # the request's objective priority (negative: sheddable)
    request_id: str = ""
    ticket: Ticket | None = None  # what the request plugins hear at its end (None: nothing to release)
    result: str = "picked"  # the `result` label of its decision (picked, picked_stale, fail_open)
    pods: int = 0  # the pods the profile chose among


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class Completion:
    """One routed request whose response Envoy showed the picker, from request headers to response end."""

    model: str
    target: str
    priority: int
    status: int
    duration: float
    request_bytes: int
    response_bytes: int
    usage: Usage | None
