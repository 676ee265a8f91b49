"""The prompt tokens each pod probably still has to compute from this picker's assignments.

A leaky bucket per pod: each assignment adds its prompt tokens, and the level drains at
``tokens_per_second`` (how fast a pod computes prompts while it also decodes). Scrapes say how many
requests wait, not how long their prompts are, and a long prompt takes several engine steps, so this is
counted apart from the scraped numbers and outlives them. With a prefix index in the profile, only the
share of the prompt the pod probably lacks in its prefix cache is counted. Pure: time comes in as
arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pointsman_picker.scheduling.contracts import RequestPlugin, Ticket
from pointsman_picker.scheduling.prefix_cache import PREFIX_MATCH
from pointsman_picker.scheduling.prompt import estimate_prompt_tokens
from pointsman_picker.scheduling.types import CycleState, DataKey, Pods, SchedulingRequest

# By pod address, the prompt tokens of this picker's recent assignments that the pod has probably not
# computed yet; a pod not in it has none.
PENDING_PREFILL: DataKey[Mapping[str, float]] = DataKey("pending prefill")
# The request's own prompt, estimated from its body (0: unknown).
PROMPT_TOKENS: DataKey[int] = DataKey("prompt tokens")


class PrefillBacklog(RequestPlugin):
    type_name: ClassVar[str] = "prefill-backlog"
    produces = (PENDING_PREFILL, PROMPT_TOKENS)

    def __init__(self, tokens_per_second: float) -> None:
        if tokens_per_second <= 0:
            raise ValueError(f"tokens_per_second must be positive, got {tokens_per_second}")
        self._rate = tokens_per_second
        self.spec = (self.type_name, repr(tokens_per_second))
        self._levels: dict[str, tuple[float, float]] = {}  # address -> (tokens, as of)

    def prepare(self, request: SchedulingRequest, pods: Pods, state: CycleState, now: float) -> Pods:
        state[PROMPT_TOKENS] = estimate_prompt_tokens(request.body)
        state[PENDING_PREFILL] = self.pending(now)
        return pods

    def picked(self, ticket: Ticket, request: SchedulingRequest, state: CycleState) -> None:
        tokens = state.get(PROMPT_TOKENS, 0)
        match = state.get(PREFIX_MATCH)
        if match is not None and match.hashes:
            # The pod computes only what its prefix cache lacks (when the profile keeps a prefix index;
            # read after every plugin prepared, so no ordering is needed).
            tokens = round(tokens * (1 - match.matched.get(ticket.address, 0) / len(match.hashes)))
        self.record(ticket.address, tokens, ticket.at)

    def record(self, address: str, tokens: int, now: float) -> None:
        if tokens <= 0:
            return
        self._levels[address] = (self._level(address, now) + tokens, now)

    def _level(self, address: str, now: float) -> float:
        entry = self._levels.get(address)
        if entry is None:
            return 0.0
        tokens, at = entry
        return max(0.0, tokens - self._rate * max(0.0, now - at))

    def pending(self, now: float) -> dict[str, float]:
        """The pods with tokens left at ``now``, and how many; forgets the drained ones."""
        out: dict[str, float] = {}
        drained = []
        for address in self._levels:
            level = self._level(address, now)
            if level > 0:
                out[address] = level
            else:
                drained.append(address)
        for address in drained:
            del self._levels[address]
        return out
