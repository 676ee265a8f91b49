"""Whether the pool can take one more request: upstream's saturation detector, on the pods as the
scheduler sees them (this picker's and its peers' assignments a scrape has not shown yet counted as
waiting).

A pod has room while its waiting requests stay under ``queue_depth`` and its KV cache under
``kv_cache``; the pool is saturated when no candidate pod has room. A request dispatched into the
room counts as waiting at once (the assignments), so one freed slot lets one request through, not the
whole queue.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pointsman_picker.scheduling.types import Pods
from pointsman_shared.config import FlowControlConfig, SchedulingConfig
from pointsman_shared.snapshot import PodSnapshot


@dataclass(frozen=True, slots=True)
class Thresholds:
    queue_depth: int
    kv_cache: float
    pod_requests: int | None = None  # running + waiting

    @classmethod
    def of(cls, flow: FlowControlConfig, scheduling: SchedulingConfig) -> Thresholds:
        """The detector's thresholds; each one unset is the scheduling profile's own."""
        detector = flow.saturation_detector
        depth = detector.queue_depth_threshold
        kv = detector.kv_cache_util_threshold
        return cls(
            depth if depth is not None else max(scheduling.queue_threshold_critical, 1),
            kv if kv is not None else scheduling.kv_cache_threshold,
            detector.max_pod_requests,
        )


def room(pod: PodSnapshot, thresholds: Thresholds, extra: int = 0) -> int:
    """How many more requests ``pod`` takes before it is saturated (``extra``: waiting requests its
    snapshot does not show, such as the peers' assignments)."""
    if pod.kv_cache_usage >= thresholds.kv_cache:
        return 0
    free = thresholds.queue_depth - pod.waiting - extra
    if thresholds.pod_requests is not None:
        free = min(free, thresholds.pod_requests - pod.running - pod.waiting - extra)
    return max(free, 0)


def saturated(pods: Pods, thresholds: Thresholds, extra: Mapping[str, int]) -> bool:
    """No pod of ``pods`` has room."""
    return not any(room(pod, thresholds, extra.get(pod.address, 0)) for pod in pods)


def saturation(pods: Pods, thresholds: Thresholds, extra: Mapping[str, int]) -> float:
    """How full the pool is, 0 to 1 (upstream's ``pool_saturation``): the mean over pods of the fuller
    of queue and KV cache against their thresholds, each capped at 1."""
    if not pods:
        return 1.0
    total = 0.0
    for pod in pods:
        waiting = pod.waiting + extra.get(pod.address, 0)
        full = max(waiting / thresholds.queue_depth, pod.kv_cache_usage / thresholds.kv_cache)
        if thresholds.pod_requests is not None:
            full = max(full, (waiting + pod.running) / thresholds.pod_requests)
        total += min(full, 1.0)
    return total / len(pods)
