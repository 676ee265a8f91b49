"""The one snapshot type: what Pointsman knows about a model-server pod, frozen.

Each field is declared once, here: the codec (``pointsman_shared.codec``) and :func:`replacer` are made
from ``dataclasses.fields``, so a field added to a type below is carried by both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any


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
    # Prefix-cache hits over queries (tokens), 0..1, over the collector's window; None: the pod exports
    # no prefix-cache metrics (or no query was counted in the window yet).
    prefix_cache_hit_rate: float | None = None
    # From vllm:cache_config_info: tokens per KV block and the blocks the GPU holds; 0 = unknown.
    block_size: int = 0
    num_gpu_blocks: int = 0
    max_lora: int = 0
    running_adapters: frozenset[str] = frozenset()
    waiting_adapters: frozenset[str] = frozenset()
    # Derived from the two above, once here: the picker tests membership for every pod of every request.
    active_adapters: frozenset[str] = field(init=False, compare=False)
    updated_at: float = 0.0
    healthy: bool = True
    reason: str = ""  # why the pod is unhealthy; empty while healthy
    field_times: FieldTimes = FieldTimes()

    def __post_init__(self) -> None:
        object.__setattr__(self, "active_adapters", self.running_adapters | self.waiting_adapters)


# What __post_init__ derives the fields that are not arguments from: a copy that changes none of these
# takes the derived fields over instead of working them out again.
_DERIVED_FROM = frozenset({"running_adapters", "waiting_adapters"})


def replacer(*names: str) -> Callable[..., PodSnapshot]:
    """A fast ``dataclasses.replace`` of the pod fields ``names``: ``replacer(*names)(pod, *values)`` is
    ``replace(pod, **dict(zip(names, values)))``.

    Made from the field list as straight-line code that sets each slot through its own descriptor, as
    dataclasses makes ``__init__``: about half the constructor's cost and a fifth of ``replace``'s
    (bench/snapshot_paths.py; the frozen ``__init__`` sets each field through ``object.__setattr__``).
    The picker copies a pod with another ``waiting`` per decision.
    """
    arguments = [f.name for f in fields(PodSnapshot) if f.init]
    if not names or len(set(names)) != len(names) or not set(names) <= set(arguments):
        raise ValueError(f"replacer takes distinct PodSnapshot fields among {arguments}, not {names}")
    lines = [f"def replace(pod, {', '.join(names)}):", "    new = _new(PodSnapshot)"]
    lines += [f"    set_{name}(new, {name if name in names else 'pod.' + name})" for name in arguments]
    if _DERIVED_FROM.isdisjoint(names):
        derived = [f.name for f in fields(PodSnapshot) if not f.init]
        lines += [f"    set_{name}(new, pod.{name})" for name in derived]
    else:
        lines.append("    new.__post_init__()")
    lines.append("    return new")
    namespace: dict[str, Any] = {"_new": object.__new__, "PodSnapshot": PodSnapshot}
    namespace |= {f"set_{f.name}": PodSnapshot.__dict__[f.name].__set__ for f in fields(PodSnapshot)}
    exec("\n".join(lines), namespace)  # the names are the type's own fields, checked above
    replace: Callable[..., PodSnapshot] = namespace["replace"]
    return replace


# The picker's copy of a pod with its own count of the requests it sent there.
replace_waiting: Callable[[PodSnapshot, int], PodSnapshot] = replacer("waiting")


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
