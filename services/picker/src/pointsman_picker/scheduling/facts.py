"""The pods' facts worked out from the pods when asked: the view of a plain tuple of pods.

A pool's pods carry their facts, kept from one decision to the next
(:mod:`~pointsman_picker.scheduling.indexed`); any other pods (a small pool, what a filter kept) are
read through :data:`PLAIN`, which makes a pass per question and keeps nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress

from pointsman_picker.scheduling.contracts import LoraGroups, Mask
from pointsman_picker.scheduling.types import Pods


class PlainFacts:
    """:class:`~pointsman_picker.scheduling.contracts.PodFacts` by a pass over the pods asked about."""

    __slots__ = ()

    def waiting(self, pods: Pods) -> list[int]:
        return [pod.waiting for pod in pods]

    def max_waiting(self, pods: Pods) -> int:
        return max([pod.waiting for pod in pods]) if pods else 0

    def waiting_range(self, pods: Pods) -> tuple[int, int]:
        if not pods:
            return 0, 0
        low = high = pods[0].waiting
        for pod in pods:  # both ends in one pass: cheaper than min() and max() of a column
            q = pod.waiting
            if q < low:
                low = q
            elif q > high:
                high = q
        return low, high

    def waiting_at_most(self, pods: Pods, limit: int) -> Pods:
        return tuple([pod for pod in pods if pod.waiting <= limit])

    def kv(self, pods: Pods) -> list[float]:
        return [pod.kv_cache_usage for pod in pods]

    def kv_range(self, pods: Pods) -> tuple[float, float]:
        if not pods:
            return 0.0, 0.0
        low = high = pods[0].kv_cache_usage
        for pod in pods:
            kv = pod.kv_cache_usage
            if kv < low:
                low = kv
            elif kv > high:
                high = kv
        return low, high

    def kv_at_most(self, pods: Pods, limit: float) -> Pods:
        return tuple([pod for pod in pods if pod.kv_cache_usage <= limit])

    def capacity(self, pods: Pods, queue: int, kv: float) -> Pods:
        return tuple([pod for pod in pods if pod.waiting <= queue and pod.kv_cache_usage <= kv])

    def lora(self, pods: Pods, target: str | None) -> LoraGroups:
        affinity: list[int] = []
        available: list[int] = []
        for i, pod in enumerate(pods):
            active = pod.active_adapters
            if target in active:  # a None target is in no pod's adapters
                affinity.append(i)
            elif len(active) < pod.max_lora:
                available.append(i)
        return affinity, available

    def take(self, pods: Pods, positions: Sequence[int]) -> Pods:
        return tuple([pods[i] for i in positions])

    def least_load(self, pods: Pods, positions: Sequence[int]) -> int:
        return min([pods[i].running + pods[i].waiting for i in positions])

    def total_load(self, pods: Pods) -> int:
        return sum([pod.running + pod.waiting for pod in pods])

    def slots(self, pods: Pods) -> int:
        return sum([pod.max_lora for pod in pods])

    def starved(self, pods: Pods) -> bool:
        return any(pod.waiting_adapters - pod.running_adapters for pod in pods)

    def select(self, pods: Pods, mask: Mask) -> Pods:
        return tuple(compress(pods, mask))


PLAIN = PlainFacts()
