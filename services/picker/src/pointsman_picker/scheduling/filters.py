"""The filters: the #423 tree's (spec §5), the `best` profile's and upstream's prefix-cache affinity.

Each reads the pods through their facts (:func:`~pointsman_picker.scheduling.indexed.facts_of`), so
the same body serves a pool's pods, which carry their facts, and any other tuple of pods.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

from pointsman_picker.scheduling.adapter_slots import RESIDENT, UNSEEN_ADAPTERS
from pointsman_picker.scheduling.assignments import POSITIONS
from pointsman_picker.scheduling.backlog import PENDING_PREFILL, PROMPT_TOKENS
from pointsman_picker.scheduling.contracts import Filter
from pointsman_picker.scheduling.indexed import facts_of
from pointsman_picker.scheduling.prefix_cache import NO_MATCH, PREFIX_MATCH, PREFIX_TRAFFIC
from pointsman_picker.scheduling.recent_targets import RECENT_TARGETS
from pointsman_picker.scheduling.types import CycleState, Pods, SchedulingRequest
from pointsman_shared.snapshot import PodSnapshot

NO_PENDING: Mapping[str, float] = MappingProxyType({})
NOWHERE: frozenset[str] = frozenset()
NO_UNSEEN: Mapping[str, frozenset[str]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class CriticalRequest(Filter):
    """All pods for a critical request, none otherwise (upstream's per-pod predicate, short-cut)."""

    type_name: ClassVar[str] = "critical-request-filter"

    def __call__(self, request: SchedulingRequest, pods: Pods, state: CycleState, rng: random.Random) -> Pods:
        return pods if request.critical else ()


@dataclass(frozen=True, slots=True)
class LowQueueing(Filter):
    """Pods with fewer than ``threshold`` waiting requests."""

    type_name: ClassVar[str] = "low-queue-filter"
    threshold: int

    def __call__(self, request: SchedulingRequest, pods: Pods, state: CycleState, rng: random.Random) -> Pods:
        facts = facts_of(pods)
        if facts.max_waiting(pods) < self.threshold:
            return pods  # the usual case, known without a pass when the pods carry their facts
        return facts.waiting_at_most(pods, self.threshold - 1)  # fewer than: counts are whole


@dataclass(frozen=True, slots=True)
class HasCapacity(Filter):
    """Pods with at most ``queue_threshold`` waiting requests and KV-cache use at most ``kv_threshold``."""

    type_name: ClassVar[str] = "has-capacity-filter"
    queue_threshold: int
    kv_threshold: float

    def __call__(self, request: SchedulingRequest, pods: Pods, state: CycleState, rng: random.Random) -> Pods:
        return facts_of(pods).capacity(pods, self.queue_threshold, self.kv_threshold)


@dataclass(frozen=True, slots=True)
class LeastQueuing(Filter):
    """Pods in the lowest band of waiting queue: ``min <= q <= min + (max - min) // n``."""

    type_name: ClassVar[str] = "least-queue-filter"

    def __call__(self, request: SchedulingRequest, pods: Pods, state: CycleState, rng: random.Random) -> Pods:
        if len(pods) < 2:
            return pods  # one pod is its own band (counts are whole)
        facts = facts_of(pods)
        low, high = facts.waiting_range(pods)
        return facts.waiting_at_most(pods, low + (high - low) // len(pods))


@dataclass(frozen=True, slots=True)
class LeastKvCache(Filter):
    """Pods in the lowest band of KV-cache use: ``min <= kv <= min + (max - min) / n``."""

    type_name: ClassVar[str] = "least-kv-cache-filter"

    def __call__(self, request: SchedulingRequest, pods: Pods, state: CycleState, rng: random.Random) -> Pods:
        if not pods:
            return ()
        facts = facts_of(pods)
        low, high = facts.kv_range(pods)
        return facts.kv_at_most(pods, low + (high - low) / len(pods))


@dataclass(frozen=True, slots=True)
class LoraSoftAffinity(Filter):
    """Prefer pods that have the target adapter active (with probability ``threshold``), else pods with
    a free adapter slot; whichever group is non-empty when only one is."""

    type_name: ClassVar[str] = "lora-affinity-filter"
    threshold: float

    def __call__(self, request: SchedulingRequest, pods: Pods, state: CycleState, rng: random.Random) -> Pods:
        facts = facts_of(pods)
        near, free = facts.lora(pods, request.target_model)
        if near and free and rng.random() >= self.threshold:
            near = free
        return facts.take(pods, near or free)


@dataclass(frozen=True, slots=True)
class LoraSpreadAffinity(Filter):
    """LoRA soft affinity that spreads a busy adapter while slots are plentiful.

    As :class:`LoraSoftAffinity` (``threshold`` included), except that:

    - the adapters this picker sent to a pod since its last scrape (``UNSEEN_ADAPTERS``) count as
      active there: the target is near a pod it was just sent to, and a slot they fill is not free;
    - a target active nowhere goes first to a free slot where it probably still sits idle
      (``RESIDENT``): no load there;
    - a pod where the target only waits while more adapters than slots are active there comes after
      the other pods (unless adapters are many, below: then waiting for a slot is the rule), and a pod
      over its slots where the target runs comes after the pods where it runs with room;
    - of the target's pods, only those within ``spread_ratio`` and ``spread_margin`` of the least
      loaded one (load: running plus waiting requests), and those holding more of the prompt than it
      (``PREFIX_MATCH``, when the profile has a prefix index);
    - when even the least loaded pod with the target carries more than ``mean * (1 + spread_ratio) +
      spread_margin`` (the mean over the pods given), the request goes to the pods with a free adapter
      slot instead, so a hot adapter gets another pod before its own pods queue. No spreading while any
      pod has an adapter waiting without running (it waits for a slot, and a spread adapter would take
      one more), nor while the adapters routed lately (``RECENT_TARGETS``) need more than
      ``max_adapter_share`` of the pods' slots, one each (adapters are many);
    - when ``held_spread_ratio`` is set and one of the target's pods holds at least half of the
      prompt's blocks (``PREFIX_MATCH``), the request spreads only past ``mean * (1 +
      held_spread_ratio) + held_spread_margin``, and never by the ``threshold`` draw: on a free slot it
      would miss the prefix its adapter's pods hold and start one more copy of it there, which the
      adapter's later requests rarely follow (least work keeps each question on the pod holding it):
      the copy costs a whole prefill and moves little load. Prompts no pod holds spread as before.
    """

    type_name: ClassVar[str] = "lora-spread-affinity-filter"
    # Also reads PREFIX_MATCH when a profile's prefix index wrote it (the band below), without asking
    # for the index: a profile without one pays nothing for it.
    consumes = (RECENT_TARGETS, RESIDENT, UNSEEN_ADAPTERS)
    threshold: float
    spread_ratio: float
    spread_margin: float
    max_adapter_share: float = 0.75
    held_spread_ratio: float | None = None
    held_spread_margin: float = 8.0

    def __call__(self, request: SchedulingRequest, pods: Pods, state: CycleState, rng: random.Random) -> Pods:
        facts = facts_of(pods)
        target = request.target_model
        near, free = facts.lora(pods, target)
        unseen = state.get(UNSEEN_ADAPTERS, NO_UNSEEN)
        extra: dict[int, int] = {}  # per position, the adapters sent there since its scrape
        if unseen:
            near, free, extra = _with_unseen(pods, target, near, free, unseen, state.get(POSITIONS))
        resident = state.get(RESIDENT, NOWHERE) if not near else NOWHERE
        if resident:
            # Active nowhere: a free slot where it probably still sits idle runs it without a load.
            warm = [i for i in free if pods[i].address in resident]
            if warm:
                near, free = warm, [i for i in free if i not in warm]
        # A pod where the adapter only waits while more adapters than its slots are active: it waits
        # until one of the others has no request left, which their steady traffic can put off for
        # seconds. More of its requests go to the pods that can run it, or a free slot, before there.
        many = state.get(RECENT_TARGETS, 0) > self.max_adapter_share * facts.slots(pods)
        held = [i for i in near if target not in pods[i].running_adapters and _over_slots(pods[i], extra, i)]
        if held and not many:
            near = [i for i in near if i not in held]
        # A pod over its slots where the adapter runs: the adapter waiting there gets a slot only when
        # one of those running has no request left. While the adapter runs on a pod with its slots in
        # hand, its requests go there, so that it drains from the crowded one and frees the slot.
        crowded = [i for i in near if _over_slots(pods[i], extra, i)]
        if crowded and len(crowded) < len(near):
            near = [i for i in near if i not in crowded]
        if len(near) > 1:
            # A slot the adapter holds on its busiest pod is better given up there: its requests go to
            # its other pods, and the load moves with them (least work alone would not move it while
            # the pods' steps look within its tolerance). A pod holding more of the prompt than the
            # least loaded one stays, for least work to weigh the prefill it saves.
            near = self._within_band(pods, near, state)
        if near and free:
            ratio, margin, explore = self.spread_ratio, self.spread_margin, True
            if self.held_spread_ratio is not None and self._holds_prompt(pods, near, state):
                ratio, margin, explore = self.held_spread_ratio, self.held_spread_margin, False
            mean = facts.total_load(pods) / len(pods)
            busy = facts.least_load(pods, near) > mean * (1.0 + ratio) + margin
            if busy and many:
                busy = False  # the slots are wanted by adapters that have none
            if busy and not facts.starved(pods):
                return facts.take(pods, free)
            if explore and rng.random() >= self.threshold:
                near = free
        return facts.take(pods, near or free or held)

    @staticmethod
    def _holds_prompt(pods: Pods, near: Sequence[int], state: CycleState) -> bool:
        """Whether one of the pods at ``near`` holds at least half of the prompt's blocks."""
        hashes, matched, _ = state.read(PREFIX_MATCH, NO_MATCH)
        if not matched:
            return False
        least = len(hashes) / 2
        return any(matched.get(pods[i].address, 0) >= least for i in near)

    def _within_band(self, pods: Pods, near: Sequence[int], state: CycleState) -> list[int]:
        loads = [pods[i].running + pods[i].waiting for i in near]
        least = min(loads)
        limit = least * (1.0 + self.spread_ratio) + self.spread_margin
        matched = state.read(PREFIX_MATCH, NO_MATCH)[1]
        floor = matched.get(pods[near[loads.index(least)]].address, 0) if matched else 0
        return [
            i
            for i, load in zip(near, loads, strict=True)
            if load <= limit or (matched and matched.get(pods[i].address, 0) > floor)
        ]


def _over_slots(pod: PodSnapshot, extra: Mapping[int, int], i: int) -> bool:
    return len(pod.active_adapters) + extra.get(i, 0) > pod.max_lora


def _with_unseen(
    pods: Pods,
    target: str | None,
    near: Sequence[int],
    free: Sequence[int],
    unseen: Mapping[str, frozenset[str]],
    positions: Mapping[str, int] | None,
) -> tuple[Sequence[int], Sequence[int], dict[int, int]]:
    """The LoRA groups with the adapters this picker sent since each pod's scrape: a pod the target was
    sent to is near it; one whose slots those adapters fill has none free. Also, per position, how
    many adapters were sent there unseen."""
    if positions is not None and len(positions) == len(pods):
        at = [(positions[a], a) for a in unseen if a in positions]  # the pool itself: no pass
    else:
        at = [(i, pod.address) for i, pod in enumerate(pods) if pod.address in unseen]
    extra: dict[int, int] = {}
    joined: list[int] = []
    full: set[int] = set()
    for i, address in at:
        adapters = unseen[address]
        extra[i] = len(adapters)
        if target in adapters:
            if pods[i].max_lora:  # no LoRA there: the target is the base model
                joined.append(i)
        elif len(pods[i].active_adapters) + len(adapters) >= pods[i].max_lora:
            full.add(i)
    if joined:
        near = sorted({*near, *joined})
        full.update(joined)
    if full:
        free = [i for i in free if i not in full]
    return near, free, extra


@dataclass(frozen=True, slots=True)
class LeastWork(Filter):
    """Pods whose estimated next engine step is within ``tolerance`` of the shortest.

    A vLLM pod with chunked prefill runs steps whose length grows with the prompt tokens it computes,
    the sequences it decodes and the tokens in its KV cache, and a new request waits for the step under
    way and then its own: ``work = per_pending_token * pending + per_running * running + per_kv_cache *
    kv_cache_usage + per_waiting * waiting``. ``pending`` is the pod's entry in ``PENDING_PREFILL``
    (prompt tokens this picker sent lately that the pod has probably not computed
    yet: a scrape says how many requests wait, not how long their prompts are); ``waiting`` already
    counts the picker's unseen assignments. Any unit will do (the defaults are milliseconds); the
    filter never comes up empty.
    """

    type_name: ClassVar[str] = "least-work-filter"
    consumes = (PENDING_PREFILL,)
    per_pending_token: float
    per_running: float
    per_kv_cache: float
    per_waiting: float
    tolerance: float

    def __call__(self, request: SchedulingRequest, pods: Pods, state: CycleState, rng: random.Random) -> Pods:
        if len(pods) < 2:
            return pods
        pending = state.read(PENDING_PREFILL, NO_PENDING)
        per_pending_token, per_running = self.per_pending_token, self.per_running
        per_kv_cache, per_waiting = self.per_kv_cache, self.per_waiting
        # One pass over the pods themselves: the work is new with every request (its pending prefill),
        # and the pods it gets after LoRA affinity are a subset without facts, where a column per
        # field costs twice the pass.
        costs = [
            per_pending_token * pending.get(pod.address, 0.0)
            + per_running * pod.running
            + per_kv_cache * pod.kv_cache_usage
            + per_waiting * pod.waiting
            for pod in pods
        ]
        limit = min(costs) + self.tolerance
        return facts_of(pods).select(pods, [cost <= limit for cost in costs])


@dataclass(frozen=True, slots=True)
class PrefixCacheAffinity(Filter):
    """Upstream's ``prefix-cache-affinity-filter``: the pods holding at least ``threshold`` of the
    prompt's blocks; all of them when none does, or, with probability ``exploration``, anyway (so other
    pods get to cache the prefix too). Upstream's latency-prediction gate is left out (Pointsman has no
    latency predictor): put the filter where load has been bounded already (after the queue filters)."""

    type_name: ClassVar[str] = "prefix-cache-affinity-filter"
    consumes = (PREFIX_MATCH,)
    threshold: float
    exploration: float

    def __call__(self, request: SchedulingRequest, pods: Pods, state: CycleState, rng: random.Random) -> Pods:
        hashes, matched, _ = state.read(PREFIX_MATCH, NO_MATCH)
        if len(pods) <= 1 or not matched or self.threshold <= 0:
            return pods
        if self.exploration > 0 and rng.random() < self.exploration:
            return pods
        least = self.threshold * len(hashes)
        sticky = tuple(pod for pod in pods if matched.get(pod.address, 0) >= least)
        return sticky or pods


@dataclass(frozen=True, slots=True)
class LeastWorkWithPrefix(Filter):
    """:class:`LeastWork` that also counts the request's own prefill on each pod: the prompt tokens the
    pod does not hold in its prefix cache (``PROMPT_TOKENS`` times the share of blocks it probably
    lacks, from ``PREFIX_MATCH``) at ``per_pending_token`` each. A pod holding most of a long prompt
    saves that much of the request's time to first token, so prefix affinity is weighed in the same
    unit as the pods' load, not as a score beside it. Prompts no pod holds take nothing off anywhere,
    so they pick as :class:`LeastWork` does (plus the same prefill on every pod).

    ``held_weight`` scales what a held token takes off: 1 counts the request's own time alone; above 1
    also the prefill a miss would add to the steps of every request on the pod that takes it instead.
    ``sole_weight`` (when above ``held_weight``) scales instead the blocks that only one of ``pods``
    holds (the longest match's blocks past the second longest): sending those elsewhere makes a second
    copy of the prefix, which evicts other prefixes where they do not all fit one pod's cache (a pod
    that has just taken many prompt groups' first requests looks busy for seconds, and a group's
    second request would otherwise go to a second pod). Blocks that other pods hold too have their
    copies already, so they keep ``held_weight``: one system prompt held by every pod but one, at a
    high weight, keeps that one idle.

    ``idle_first``: a prompt whose held blocks no pod holds alone (a system prompt every conversation
    starts with, on several pods) goes to a pod with nothing running, waiting or pending, when there
    is one. The costs see only this request: a pod lacking a prompt that the others hold loses every
    new conversation by the prefill the prompt saves (512 tokens: 18 ms) until every other pod carries
    that much more load, and the conversations' later turns follow them, so at moderate load a pod of
    eight stayed idle for most of a minute (bench/results/prefix-gap-2026-12-03.md).

    ``cold_weight`` (when above ``sole_weight``) scales instead the blocks one pod holds alone when the
    prefix is cold: the recent requests beginning with the prompt's first block fit one pod
    (``PREFIX_TRAFFIC`` below 1: a prompt group's system prompt, not one that all the traffic shares).
    A short prefix saves little of a long prompt's prefill (256 of 2,304 tokens: 9 ms), so the sole
    weight alone lets each of its group's requests go to whichever pod is a few milliseconds less busy;
    its copies on several pods then each see the group too rarely to outlast the cache's eviction, and
    the group misses its prefix on most of them. A hot prefix needs several pods anyway: weighed so, it
    would keep every new conversation on the first pod to hold their system prompt (multi-turn at 0.3
    load with a sole weight of 12: p99 TTFT 35 ms -> 6.5 s)."""

    type_name: ClassVar[str] = "least-work-prefix-filter"
    consumes = (PENDING_PREFILL, PROMPT_TOKENS, PREFIX_MATCH, PREFIX_TRAFFIC)
    per_pending_token: float
    per_running: float
    per_kv_cache: float
    per_waiting: float
    tolerance: float
    held_weight: float = 1.0
    sole_weight: float = 1.0
    idle_first: bool = False
    cold_weight: float = 1.0

    def __call__(self, request: SchedulingRequest, pods: Pods, state: CycleState, rng: random.Random) -> Pods:
        if len(pods) < 2:
            return pods
        pending = state.read(PENDING_PREFILL, NO_PENDING)
        # No match written (a profile run without its request plugins): nothing is held, as LeastWork.
        hashes, matched, _ = state.read(PREFIX_MATCH, NO_MATCH)
        sole = max(self.sole_weight, self.cold_weight) > self.held_weight
        prompt = state.read(PROMPT_TOKENS, 0)
        per_pending_token, per_running = self.per_pending_token, self.per_running
        per_kv_cache, per_waiting = self.per_kv_cache, self.per_waiting
        # The prefill every pod would do without a hit; a hit takes its share of the blocks off.
        own = per_pending_token * prompt
        per_block = own / len(hashes) if hashes else 0.0
        held = [matched.get(pod.address, 0) for pod in pods]
        saved = [per_block * self.held_weight * n for n in held]
        if (sole or self.idle_first) and any(held):
            top = max(range(len(held)), key=held.__getitem__)
            alone = held[top] - max(n for i, n in enumerate(held) if i != top)
            if alone and sole:
                weight = max(self.sole_weight, self.held_weight)
                # No traffic written (a profile run without its request plugins): hot.
                if self.cold_weight > weight and state.read(PREFIX_TRAFFIC, 1.0) < 1.0:
                    weight = self.cold_weight
                saved[top] += per_block * (weight - self.held_weight) * alone
            if not alone and self.idle_first:
                idle = [not (pod.running or pod.waiting or pending.get(pod.address, 0.0)) for pod in pods]
                if any(idle):
                    return facts_of(pods).select(pods, idle)
        costs = [
            per_pending_token * pending.get(pod.address, 0.0)
            + own
            - saved[i]
            + per_running * pod.running
            + per_kv_cache * pod.kv_cache_usage
            + per_waiting * pod.waiting
            for i, pod in enumerate(pods)
        ]
        limit = min(costs) + self.tolerance
        return facts_of(pods).select(pods, [cost <= limit for cost in costs])
