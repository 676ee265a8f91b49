"""Pod and pool snapshots in one line, as upstream's tests write ``P(0, waiting=10, kv=0.2, "foo")``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, get_type_hints

from pointsman_shared.snapshot import FieldTimes, PodSnapshot, PoolSnapshot

NOW = 1_700_000_000.0


def pod(
    waiting: int = 0,
    kv: float = 0.0,
    max_lora: int = 0,
    adapters: Iterable[str] = (),
    *,
    address: str = "10.0.0.1:8000",
    running: int = 0,
    waiting_adapters: Iterable[str] = (),
    updated_at: float = NOW,
    healthy: bool = True,
    reason: str = "",
    field_times: FieldTimes = FieldTimes(),  # noqa: B008  (frozen: one shared default is safe)
    prefix_cache_hit_rate: float | None = None,
    block_size: int = 0,
    num_gpu_blocks: int = 0,
) -> PodSnapshot:
    """``adapters`` are the running adapters; active = running | waiting."""
    return PodSnapshot(
        address=address,
        waiting=waiting,
        running=running,
        kv_cache_usage=kv,
        prefix_cache_hit_rate=prefix_cache_hit_rate,
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        max_lora=max_lora,
        running_adapters=frozenset(adapters),
        waiting_adapters=frozenset(waiting_adapters),
        updated_at=updated_at,
        healthy=healthy,
        reason=reason,
        field_times=field_times,
    )


def pool_pods(*pods: PodSnapshot, subnet: str = "192.168.1", port: int = 8000) -> tuple[PodSnapshot, ...]:
    """Give pod i the address ``subnet.(i+1):port``, as upstream's end-to-end tests do."""
    return tuple(dataclasses.replace(p, address=f"{subnet}.{i + 1}:{port}") for i, p in enumerate(pods))


def snapshot(
    *pods: PodSnapshot, version: int = 1, pool: str = "test-pool", published_at: float = NOW
) -> PoolSnapshot:
    return PoolSnapshot(pool=pool, version=version, published_at=published_at, pods=tuple(pods))


# For each type of snapshot field, a value unlike its default; the field's position makes it unlike the
# others'.
_VALUES: dict[object, Callable[[int], object]] = {
    int: lambda i: 7 + i,
    float: lambda i: 0.25 + i,
    float | None: lambda i: 0.25 + i,
    str: lambda i: f"set-{i}",
    frozenset[str]: lambda i: frozenset({f"set-{i}"}),
}


def every_field_set(cls: Any = PodSnapshot) -> Any:
    """A ``cls`` (PodSnapshot, FieldTimes) whose every field is away from its default and unlike the
    others, made from the field list: a field added to a snapshot type is in it (one of a new type fails
    here until ``_VALUES`` has it)."""
    hints = get_type_hints(cls)
    values: dict[str, object] = {}
    for i, field in enumerate(dataclasses.fields(cls)):
        if not field.init:
            continue
        kind = hints[field.name]
        if dataclasses.is_dataclass(kind):
            values[field.name] = every_field_set(kind)
        elif kind is bool:
            values[field.name] = not field.default
        else:
            values[field.name] = _VALUES[kind](i)
    return cls(**values)
