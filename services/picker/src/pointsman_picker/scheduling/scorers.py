"""The scorers (spec §6): one score per pod in [0, 1], which a profile weights and sums."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pointsman_picker.scheduling.contracts import Scorer
from pointsman_picker.scheduling.indexed import facts_of
from pointsman_picker.scheduling.prefix_cache import PREFIX_MATCH
from pointsman_picker.scheduling.types import CycleState, Pods, SchedulingRequest


@dataclass(frozen=True, slots=True)
class QueueScorer(Scorer):
    """``(maxQ - q) / (maxQ - minQ)``; every pod 1.0 when all queues are equal."""

    type_name: ClassVar[str] = "queue-scorer"

    def __call__(self, request: SchedulingRequest, pods: Pods, state: CycleState) -> list[float]:
        facts = facts_of(pods)
        low, high = facts.waiting_range(pods)
        if high == low:
            return [1.0] * len(pods)
        return [(high - q) / (high - low) for q in facts.waiting(pods)]


@dataclass(frozen=True, slots=True)
class KvCacheScorer(Scorer):
    """``1 - kv``: the free share of the KV cache."""

    type_name: ClassVar[str] = "kv-cache-scorer"

    def __call__(self, request: SchedulingRequest, pods: Pods, state: CycleState) -> list[float]:
        return [1.0 - kv for kv in facts_of(pods).kv(pods)]


@dataclass(frozen=True, slots=True)
class LoraAffinityScorer(Scorer):
    """1.0 adapter running, 0.8 a free adapter slot, 0.6 adapter waiting, else 0."""

    type_name: ClassVar[str] = "lora-affinity-scorer"

    def __call__(self, request: SchedulingRequest, pods: Pods, state: CycleState) -> list[float]:
        target = request.target_model
        if target is None:
            return [0.0] * len(pods)
        scores = []
        for pod in pods:
            if target in pod.running_adapters:
                scores.append(1.0)
            elif len(pod.active_adapters) < pod.max_lora:
                scores.append(0.8)
            elif target in pod.waiting_adapters:
                scores.append(0.6)
            else:
                scores.append(0.0)
        return scores


@dataclass(frozen=True, slots=True)
class PrefixCacheScorer(Scorer):
    """The share of the prompt's blocks the pod probably holds in its prefix cache (upstream's: matched
    blocks / total blocks); 0 for every pod when the prompt is shorter than a block."""

    type_name: ClassVar[str] = "prefix-cache-scorer"
    consumes = (PREFIX_MATCH,)

    def __call__(self, request: SchedulingRequest, pods: Pods, state: CycleState) -> list[float]:
        hashes, matched, _ = state[PREFIX_MATCH]
        if not hashes or not matched:
            return [0.0] * len(pods)
        total = len(hashes)
        return [matched.get(pod.address, 0) / total for pod in pods]
