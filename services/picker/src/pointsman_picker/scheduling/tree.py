"""Filter trees: nodes and their walk, and the tree of upstream #423 (spec §5).

A node filters the pod list. A non-empty result goes to ``on_success``; an empty one sends the node's
*input* to ``on_failure``. A missing branch ends the walk with what the node has (its result); a
:class:`~pointsman_picker.scheduling.types.Drop` branch ends it with the request dropped.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from pointsman_picker.scheduling.contracts import Filter
from pointsman_picker.scheduling.filters import (
    CriticalRequest,
    HasCapacity,
    LeastKvCache,
    LeastQueuing,
    LoraSoftAffinity,
    LowQueueing,
)
from pointsman_picker.scheduling.types import CycleState, Drop, Pods, SchedulingRequest
from pointsman_shared.config import SchedulingConfig

# Told each node's name and how many pods it kept, in walk order (to explain a decision, to time nodes).
StepSink = Callable[[str, int], None]

DROP_SHEDDABLE = Drop("dropping request due to limited backend resources")


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    filter: Filter
    on_success: Node | Drop | None = None
    on_failure: Node | Drop | None = None


def either_way(name: str, filter: Filter, next_node: Node | Drop | None = None) -> Node:
    """A node whose success and failure both lead to ``next_node``."""
    return Node(name, filter, on_success=next_node, on_failure=next_node)


def run_tree(
    root: Node,
    request: SchedulingRequest,
    pods: Pods,
    state: CycleState,
    rng: random.Random,
    on_step: StepSink | None = None,
) -> Pods | Drop:
    node = root
    while True:
        # The method, not the instance: a call through the type's call slot costs three times as much,
        # a tenth of a small pool's filter.
        kept = node.filter.__call__(request, pods, state, rng)
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


def tree_filters(node: Node | Drop | None) -> list[Filter]:
    """Every filter of the tree from ``node``, each once (a filter may sit on several nodes)."""
    filters: dict[int, Filter] = {}
    seen: set[int] = set()
    todo = [node]
    while todo:
        item = todo.pop()
        if not isinstance(item, Node) or id(item) in seen:
            continue
        seen.add(id(item))
        filters.setdefault(id(item.filter), item.filter)
        todo += [item.on_success, item.on_failure]
    return list(filters.values())


def build_tree(config: SchedulingConfig) -> Node:
    """The #423 tree, with the thresholds from the config."""
    affinity = LoraSoftAffinity(config.lora_affinity_threshold)
    least_queuing, least_kv_cache = LeastQueuing(), LeastKvCache()

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
        LowQueueing(config.queueing_threshold_lora),
        on_success=either_way("LoRA soft affinity", affinity, queue_and_kv),
        on_failure=queue_lora_and_kv,
    )
    sheddable = Node(
        "has capacity for sheddable requests",
        HasCapacity(config.queue_threshold_critical, config.kv_cache_threshold),
        on_success=queue_lora_and_kv,
        on_failure=DROP_SHEDDABLE,
    )
    return Node("critical request", CriticalRequest(), on_success=low_latency, on_failure=sheddable)
