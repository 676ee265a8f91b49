"""Filter nodes and the filters of the #423 tree (spec §5).

A node filters the pod list. A non-empty result goes to ``on_success``; an empty one sends the node's
*input* to ``on_failure``. A missing branch ends the walk with what the node has (its result).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

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
        return tuple(pod for pod in pods if pod.waiting < threshold)

    return apply


def has_capacity(queue_threshold: int, kv_threshold: float) -> FilterFn:
    """Pods with at most ``queue_threshold`` waiting requests and KV-cache use at most ``kv_threshold``."""

    def apply(request: SchedulingRequest, pods: Pods, rng: random.Random) -> Pods:
        return tuple(
            pod for pod in pods if pod.waiting <= queue_threshold and pod.kv_cache_usage <= kv_threshold
        )

    return apply


def least_queuing(request: SchedulingRequest, pods: Pods, rng: random.Random) -> Pods:
    """Pods in the lowest band of waiting queue: ``min <= q <= min + (max - min) // n``."""
    if not pods:
        return ()
    waiting = [pod.waiting for pod in pods]
    low = min(waiting)
    limit = low + (max(waiting) - low) // len(pods)
    return tuple(pod for pod in pods if pod.waiting <= limit)


def least_kv_cache(request: SchedulingRequest, pods: Pods, rng: random.Random) -> Pods:
    """Pods in the lowest band of KV-cache use: ``min <= kv <= min + (max - min) / n``."""
    if not pods:
        return ()
    usage = [pod.kv_cache_usage for pod in pods]
    low = min(usage)
    limit = low + (max(usage) - low) / len(pods)
    return tuple(pod for pod in pods if pod.kv_cache_usage <= limit)


def lora_soft_affinity(threshold: float) -> FilterFn:
    """Prefer pods that have the target adapter active (with probability ``threshold``), else pods with
    a free adapter slot; whichever group is non-empty when only one is."""

    def apply(request: SchedulingRequest, pods: Pods, rng: random.Random) -> Pods:
        target = request.target_model
        affinity: list[PodSnapshot] = []
        available: list[PodSnapshot] = []
        for pod in pods:
            active = pod.active_adapters
            if target is not None and target in active:
                affinity.append(pod)
            elif len(active) < pod.max_lora:
                available.append(pod)
        if affinity and available:
            return tuple(affinity) if rng.random() < threshold else tuple(available)
        return tuple(affinity or available)

    return apply
