"""The one snapshot type: what Pointsman knows about a model-server pod, frozen."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class FieldTimes:
    """When each field of a pod was last read from its page (unix seconds; 0 = never).

    A page without some family (no LoRA metrics, an older server) still updates the others: the
    missing fields keep their values and their older times, so a reader can tell how fresh each is.
    """

    waiting: float = 0.0
    running: float = 0.0
    kv_cache_usage: float = 0.0
    lora: float = 0.0  # max_lora and the adapter sets


@dataclass(frozen=True, slots=True)
class PodSnapshot:
    """One pod's normalized state, as of ``updated_at`` (unix seconds of the last good scrape)."""

    address: str  # "ip:port", what Envoy's ORIGINAL_DST cluster dials
    waiting: int = 0
    running: int = 0
    kv_cache_usage: float = 0.0  # fraction 0..1
    max_lora: int = 0
    running_adapters: frozenset[str] = frozenset()
    waiting_adapters: frozenset[str] = frozenset()
    updated_at: float = 0.0
    healthy: bool = True
    reason: str = ""  # why the pod is unhealthy; empty while healthy
    field_times: FieldTimes = FieldTimes()
    active_adapters: frozenset[str] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        # Derived once here: the picker tests membership for every pod of every request.
        object.__setattr__(self, "active_adapters", self.running_adapters | self.waiting_adapters)


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """Every pod of one pool, as one collector round published it.

    ``version`` grows with every publish; ``published_at`` is unix seconds.
    """

    pool: str
    version: int
    published_at: float
    pods: tuple[PodSnapshot, ...]


def is_fresh(pod: PodSnapshot, now: float, max_age: float) -> bool:
    """A pod's data is fresh while its last good scrape is at most ``max_age`` seconds old."""
    return now - pod.updated_at <= max_age
