"""The filter tree of upstream #423 (spec §5), with the thresholds from the config."""

from __future__ import annotations

from pointsman_picker.scheduling.filters import (
    Drop,
    Node,
    critical_request,
    either_way,
    has_capacity,
    least_kv_cache,
    least_queuing,
    lora_soft_affinity,
    low_queueing,
)
from pointsman_shared.config import SchedulingConfig

DROP_SHEDDABLE = Drop("dropping request due to limited backend resources")


def build_tree(config: SchedulingConfig) -> Node:
    affinity = lora_soft_affinity(config.lora_affinity_threshold)

    # least queuing -> least KV
    queue_and_kv = either_way("least queuing", least_queuing, either_way("least KV cache", least_kv_cache))
    # least queuing -> LoRA soft affinity -> least KV
    queue_lora_and_kv = either_way(
        "least queuing",
        least_queuing,
        either_way("LoRA soft affinity", affinity, either_way("least KV cache", least_kv_cache)),
    )
    low_latency = Node(
        "low queueing",
        low_queueing(config.queueing_threshold_lora),
        on_success=either_way("LoRA soft affinity", affinity, queue_and_kv),
        on_failure=queue_lora_and_kv,
    )
    sheddable = Node(
        "has capacity for sheddable requests",
        has_capacity(config.queue_threshold_critical, config.kv_cache_threshold),
        on_success=queue_lora_and_kv,
        on_failure=DROP_SHEDDABLE,
    )
    return Node("critical request", critical_request, on_success=low_latency, on_failure=sheddable)
