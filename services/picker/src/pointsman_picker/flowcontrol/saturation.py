"""Whether the pool can take one more request: upstream's saturation detector, on the pods as the
scheduler sees them (this picker's and its peers' assignments a scrape has not shown yet counted as
waiting), with a pool-wide measure of work beside it.

A pod has room while its waiting requests stay under ``queue_depth`` and its KV cache under
``kv_cache`` (upstream's); the pool is saturated when no candidate pod has room, or, with
``pod_requests`` set, when its pods carry on average that many running plus waiting requests. The
second is the one that tracks load in a mix where requests wait for a LoRA slot: a pod's waiting
count there says which adapters are short of slots, not how busy the pool is, and the adapters' own
pods differ (one pod may idle while the others run hundreds), so "some pod has room" stays true
however loaded the pool is. A request dispatched counts as waiting at once (the assignments), so one
freed slot lets one request through, not the whole queue. The controller asks :func:`room` of the
pod the profile picks too: a pod without room is handed no request while another has room.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from pointsman_picker.scheduling.types import Pods
from pointsman_shared.config import FlowControlConfig, SaturationDetectorConfig, SchedulingConfig
from pointsman_shared.snapshot import PodSnapshot

T = TypeVar("T")
_UNSET = SaturationDetectorConfig()


@dataclass(frozen=True, slots=True)
class Thresholds:
    queue_depth: int
    kv_cache: float
    pod_requests: int | None = None  # running + waiting, on average over the pool's pods

    @classmethod
    def of(
        cls, flow: FlowControlConfig, scheduling: SchedulingConfig, priority: int | None = None
    ) -> Thresholds:
        """The detector's thresholds for the band of ``priority`` (``None``: the pool-wide ones); each
        one the band leaves unset is the pool-wide detector's, and each one that leaves unset the
        scheduling profile's own."""
        pool = flow.saturation_detector
        band = (flow.band(priority).saturation_detector if priority is not None else None) or _UNSET
        depth = _first(band.queue_depth_threshold, pool.queue_depth_threshold)
        kv = _first(band.kv_cache_util_threshold, pool.kv_cache_util_threshold)
        return cls(
            depth if depth is not None else max(scheduling.queue_threshold_critical, 1),
            kv if kv is not None else scheduling.kv_cache_threshold,
            _first(band.max_pod_requests, pool.max_pod_requests),
        )


def _first(*values: T | None) -> T | None:
    return next((v for v in values if v is not None), None)


def room(pod: PodSnapshot, thresholds: Thresholds, extra: int = 0) -> int:
    """How many more requests ``pod`` takes before its queue or KV cache is saturated (``extra``:
    waiting requests its snapshot does not show, such as the peers' assignments)."""
    if pod.kv_cache_usage >= thresholds.kv_cache:
        return 0
    return max(thresholds.queue_depth - pod.waiting - extra, 0)


def saturated(pods: Pods, thresholds: Thresholds, extra: Mapping[str, int]) -> bool:
    """No pod of ``pods`` has room, or they carry ``pod_requests`` on average."""
    if thresholds.pod_requests is not None and pods:
        load = sum(pod.running + pod.waiting + extra.get(pod.address, 0) for pod in pods)
        if load >= thresholds.pod_requests * len(pods):
            return True
    return not any(room(pod, thresholds, extra.get(pod.address, 0)) for pod in pods)


def saturation(pods: Pods, thresholds: Thresholds, extra: Mapping[str, int]) -> float:
    """How full the pool is, 0 to 1 (upstream's ``pool_saturation``): the mean over pods of the fuller
    of queue and KV cache against their thresholds, each capped at 1; with ``pod_requests``, at
    least the pool's mean running plus waiting requests against it."""
    if not pods:
        return 1.0
    total = 0.0
    load = 0
    for pod in pods:
        waiting = pod.waiting + extra.get(pod.address, 0)
        load += waiting + pod.running
        total += min(max(waiting / thresholds.queue_depth, pod.kv_cache_usage / thresholds.kv_cache), 1.0)
    full = total / len(pods)
    if thresholds.pod_requests is not None:
        full = max(full, min(load / (thresholds.pod_requests * len(pods)), 1.0))
    return full
