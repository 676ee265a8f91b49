"""Filter nodes and the filters of the #423 tree (spec §5).

A node filters the pod list. A non-empty result goes to ``on_success``; an empty one sends the node's
*input* to ``on_failure``. A missing branch ends the walk with what the node has (its result).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from pointsman_picker.scheduling.indexed import facts_of, lora_groups, select
from pointsman_picker.scheduling.types import Pods, SchedulingRequest
from pointsman_shared.snapshot import PodSnapshot

FilterFn = Callable[[SchedulingRequest, Pods, random.Random], Pods]
# Told each node's name and how many pods it kept, in walk order (to explain a decision, to time nodes).
StepSink = Callable[[str, int], None]


@dataclass(frozen=True, slots=True)
class Drop:
    """A terminal branch: the request is dropped."""

    reason: str


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    filter: FilterFn
    on_success: Node | Drop | None = None
    on_failure: Node | Drop | None = None


def either_way(name: str, fn: FilterFn, next_node: Node | Drop | None = None) -> Node:
    """A node whose success and failure both lead to ``next_node``."""
    return Node(name, fn, on_success=next_node, on_failure=next_node)


def run_tree(
    root: Node, request: SchedulingRequest, pods: Pods, rng: random.Random, on_step: StepSink | None = None
) -> Pods | Drop:
    node = root
    while True:
        kept = node.filter(request, pods, rng)
        if on_step is not None:
            on_step(node.name, len(kept))
        branch = node.on_success if kept else node.on_failure
        if branch is None:
            return kept
        if isinstance(branch, Drop):
            return branch
        if kept:
            pods = kept
        node = branch


def critical_request(request: SchedulingRequest, pods: Pods, rng: random.Random) -> Pods:
    """All pods for a critical request, none otherwise (upstream's per-pod predicate, short-cut)."""
    return pods if request.critical else ()


def low_queueing(threshold: int) -> FilterFn:
    """Pods with fewer than ``threshold`` waiting requests."""

    def apply(request: SchedulingRequest, pods: Pods, rng: random.Random) -> Pods:
        facts = facts_of(pods)
        if facts is None:
            return tuple([pod for pod in pods if pod.waiting < threshold])
        if facts.max_waiting(pods) < threshold:
            return pods  # the usual case, known without a pass
        return select(pods, [q < threshold for q in facts.waiting(pods)])

    return apply


def has_capacity(queue_threshold: int, kv_threshold: float) -> FilterFn:
    """Pods with at most ``queue_threshold`` waiting requests and KV-cache use at most ``kv_threshold``."""

    def apply(request: SchedulingRequest, pods: Pods, rng: random.Random) -> Pods:
        facts = facts_of(pods)
        if facts is not None:
            return select(pods, facts.capacity(pods, queue_threshold, kv_threshold))
        return tuple(
            [pod for pod in pods if pod.waiting <= queue_threshold and pod.kv_cache_usage <= kv_threshold]
        )

    return apply


def least_queuing(request: SchedulingRequest, pods: Pods, rng: random.Random) -> Pods:
    """Pods in the lowest band of waiting queue: ``min <= q <= min + (max - min) // n``."""
    if not pods:
        return ()
    facts = facts_of(pods)
    if facts is not None:
        waiting = facts.waiting(pods)
        low = min(waiting)
        limit = low + (facts.max_waiting(pods) - low) // len(pods)
        return select(pods, [q <= limit for q in waiting])
    low = high = pods[0].waiting
    for pod in pods:  # both ends in one pass: cheaper than min() and max() of a column
        q = pod.waiting
        if q < low:
            low = q
        elif q > high:
            high = q
    limit = low + (high - low) // len(pods)
    return tuple([pod for pod in pods if pod.waiting <= limit])


def least_kv_cache(request: SchedulingRequest, pods: Pods, rng: random.Random) -> Pods:
    """Pods in the lowest band of KV-cache use: ``min <= kv <= min + (max - min) / n``."""
    if not pods:
        return ()
    facts = facts_of(pods)
    if facts is not None:
        usage = facts.columns.kv(pods)
        low = min(usage)
        limit = low + (max(usage) - low) / len(pods)
        return select(pods, [kv <= limit for kv in usage])
    low = high = pods[0].kv_cache_usage
    for pod in pods:
        kv = pod.kv_cache_usage
        if kv < low:
            low = kv
        elif kv > high:
            high = kv
    limit = low + (high - low) / len(pods)
    return tuple([pod for pod in pods if pod.kv_cache_usage <= limit])


def lora_soft_affinity(threshold: float) -> FilterFn:
    """Prefer pods that have the target adapter active (with probability ``threshold``), else pods with
    a free adapter slot; whichever group is non-empty when only one is."""

    def apply(request: SchedulingRequest, pods: Pods, rng: random.Random) -> Pods:
        facts = facts_of(pods)
        if facts is not None:
            take_near, take_free = facts.columns.lora(pods, request.target_model)
            if take_near and take_free and rng.random() >= threshold:
                take_near = take_free
            take = take_near or take_free
            return () if take is None else take(pods)
        near, free = lora_groups(pods, request.target_model)
        if near and free and rng.random() >= threshold:
            near = free
        return tuple([pods[i] for i in near or free])

    return apply


def least_work(
    per_pending_token: float,
    per_running: float,
    per_kv_cache: float,
    per_waiting: float,
    tolerance: float,
) -> FilterFn:
    """Pods whose estimated next engine step is within ``tolerance`` of the shortest.

    A vLLM pod with chunked prefill runs steps whose length grows with the prompt tokens it computes,
    the sequences it decodes and the tokens in its KV cache, and a new request waits for the step under
    way and then its own: ``work = per_pending_token * pending + per_running * running + per_kv_cache *
    kv_cache_usage + per_waiting * waiting``. ``pending`` is the pod's entry in the request's
    ``pending_prefill`` (prompt tokens this picker sent lately that the pod has probably not computed
    yet: a scrape says how many requests wait, not how long their prompts are); ``waiting`` already
    counts the picker's unseen assignments. Any unit will do (the defaults are milliseconds); the
    filter never comes up empty.
    """

    def apply(request: SchedulingRequest, pods: Pods, rng: random.Random) -> Pods:
        if len(pods) < 2:
            return pods
        pending = request.pending_prefill
        costs = [
            per_pending_token * pending.get(pod.address, 0.0)
            + per_running * pod.running
            + per_kv_cache * pod.kv_cache_usage
            + per_waiting * pod.waiting
            for pod in pods
        ]
        limit = min(costs) + tolerance
        return select(pods, [cost <= limit for cost in costs])

    apply.uses_pending_prefill = True  # type: ignore[attr-defined]
    return apply


def uses_pending_prefill(node: Node | Drop | None) -> bool:
    """Whether a filter of the tree from ``node`` reads the request's ``pending_prefill``."""
    seen: set[int] = set()
    todo = [node]
    while todo:
        item = todo.pop()
        if not isinstance(item, Node) or id(item) in seen:
            continue
        seen.add(id(item))
        if getattr(item.filter, "uses_pending_prefill", False):
            return True
        todo += [item.on_success, item.on_failure]
    return False


def _load(pod: PodSnapshot) -> int:
    return pod.running + pod.waiting


def lora_spread_affinity(
    threshold: float, spread_ratio: float, spread_margin: float, max_adapter_share: float = 0.75
) -> FilterFn:
    """LoRA soft affinity that spreads a busy adapter while slots are plentiful.

    As :func:`lora_soft_affinity` (``threshold`` included), except that when even the least loaded
    pod with the target adapter active carries more than ``mean * (1 + spread_ratio) + spread_margin``
    (load: running plus waiting requests; the mean over the pods given), the request goes to the pods
    with a free adapter slot instead, so a hot adapter gets another pod before its own pods queue. No
    spreading while any pod has an adapter waiting without running: that adapter waits for a slot, and
    a spread adapter would take one more; nor while the adapters routed lately (the request's
    ``recent_targets``) need more than ``max_adapter_share`` of the pods' slots, one each.
    """

    def apply(request: SchedulingRequest, pods: Pods, rng: random.Random) -> Pods:
        near, free = lora_groups(pods, request.target_model)
        if near and free:
            mean = sum(_load(pod) for pod in pods) / len(pods)
            busy = min(_load(pods[i]) for i in near) > mean * (1.0 + spread_ratio) + spread_margin
            if busy and request.recent_targets > max_adapter_share * sum(pod.max_lora for pod in pods):
                busy = False  # the slots are wanted by adapters that have none
            if busy and not any(pod.waiting_adapters - pod.running_adapters for pod in pods):
                return tuple([pods[i] for i in free])
            if rng.random() >= threshold:
                near = free
        return tuple([pods[i] for i in near or free])

    return apply
