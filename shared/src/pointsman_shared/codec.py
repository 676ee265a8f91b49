"""The versioned encoding of a pool snapshot in Redis (docs/redis-schema.md).

The blob is JSON (orjson). Its ``codec`` field names the layout; a reader refuses layouts it does not
know instead of guessing. Layout 2 added each pod's ``fieldTimes``; layout 1 blobs (from a collector
not yet upgraded) still decode, every field time being the pod's ``updatedAt``.
The snapshot's ``version`` is stored beside the blob, not inside it, because Redis assigns it
atomically at publish time.
"""

from __future__ import annotations

from typing import Any

import orjson

from pointsman_shared.snapshot import FieldTimes, PodSnapshot, PoolSnapshot

CODEC_VERSION = 2
# Layouts this reader decodes: a picker upgraded first keeps reading an older collector.
READABLE = (1, 2)


class CodecError(ValueError):
    """A blob that is not a pool snapshot this reader understands."""


def pod_to_dict(pod: PodSnapshot) -> dict[str, Any]:
    """The JSON form of a pod, as the collector's ``GET /v1/pool`` shows it."""
    return {
        "address": pod.address,
        "waiting": pod.waiting,
        "running": pod.running,
        "kvCacheUsage": pod.kv_cache_usage,
        "maxLora": pod.max_lora,
        "runningAdapters": sorted(pod.running_adapters),
        "waitingAdapters": sorted(pod.waiting_adapters),
        "activeAdapters": sorted(pod.active_adapters),
        "updatedAt": pod.updated_at,
        "healthy": pod.healthy,
        "reason": pod.reason,
        "fieldTimes": _times_to_dict(pod.field_times),
    }


def encode_pool(pool: PoolSnapshot) -> bytes:
    return orjson.dumps(
        {
            "codec": CODEC_VERSION,
            "pool": pool.pool,
            "publishedAt": pool.published_at,
            "pods": [_encode_pod(pod) for pod in pool.pods],
        }
    )


def encode_pod(pod: PodSnapshot) -> bytes:
    """One pod's object of the blob's ``pods`` array (sharing collectors assemble the array in Redis)."""
    return orjson.dumps(_encode_pod(pod))


class PoolEncoder:
    """:func:`encode_pool` and :func:`encode_pod` for a publisher that encodes its pool again and again:
    a pod whose snapshot is the same object as at the last call is not encoded again.

    Snapshots are frozen, so the same object means the same bytes; between two publishes of a
    collector only the pods scraped since have new snapshots. The bytes are those of the functions.
    """

    def __init__(self) -> None:
        self._kept: dict[str, tuple[PodSnapshot, bytes]] = {}

    def pool(self, pool: PoolSnapshot) -> bytes:
        head = orjson.dumps({"codec": CODEC_VERSION, "pool": pool.pool, "publishedAt": pool.published_at})
        return b'%s,"pods":[%s]}' % (head[:-1], b",".join(self.pods(pool.pods)))

    def pods(self, pods: tuple[PodSnapshot, ...]) -> list[bytes]:
        """Each pod's :func:`encode_pod` bytes; pods not among these are forgotten."""
        kept = self._kept
        fresh: dict[str, tuple[PodSnapshot, bytes]] = {}
        encoded: list[bytes] = []
        for pod in pods:
            hit = kept.get(pod.address)
            # Identity, not equality: comparing two snapshots field by field costs about as much as
            # encoding one. The kept snapshot is referenced, so its id cannot pass to another object.
            data = hit[1] if hit is not None and hit[0] is pod else orjson.dumps(_encode_pod(pod))
            fresh[pod.address] = (pod, data)
            encoded.append(data)
        self._kept = fresh
        return encoded


def decode_pool(data: bytes, version: int) -> PoolSnapshot:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise CodecError(f"snapshot is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise CodecError("snapshot is not a JSON object")
    codec = doc.get("codec")
    if isinstance(codec, bool) or codec not in READABLE:
        raise CodecError(f"snapshot codec {codec!r} is not supported (this reader knows {READABLE})")
    try:
        return PoolSnapshot(
            pool=_str(doc["pool"]),
            version=version,
            published_at=_num(doc["publishedAt"]),
            pods=tuple(_decode_pod(p, codec) for p in doc["pods"]),
        )
    except (KeyError, TypeError) as exc:
        raise CodecError(f"snapshot is missing or mistypes a field: {exc}") from exc


def _encode_pod(pod: PodSnapshot) -> dict[str, Any]:
    return {
        "address": pod.address,
        "waiting": pod.waiting,
        "running": pod.running,
        "kv": pod.kv_cache_usage,
        "maxLora": pod.max_lora,
        "runningAdapters": sorted(pod.running_adapters),
        "waitingAdapters": sorted(pod.waiting_adapters),
        "updatedAt": pod.updated_at,
        "healthy": pod.healthy,
        "reason": pod.reason,
        "fieldTimes": _times_to_dict(pod.field_times),
    }


def _times_to_dict(times: FieldTimes) -> dict[str, float]:
    return {
        "waiting": times.waiting,
        "running": times.running,
        "kv": times.kv_cache_usage,
        "lora": times.lora,
    }


def _decode_pod(doc: Any, codec: int) -> PodSnapshot:
    if not isinstance(doc, dict):
        raise TypeError("pod is not an object")
    updated_at = _num(doc["updatedAt"])
    if codec == 1:
        times = FieldTimes(updated_at, updated_at, updated_at, updated_at)
    else:
        raw = doc["fieldTimes"]
        if not isinstance(raw, dict):
            raise TypeError(f"expected an object, got {raw!r}")
        times = FieldTimes(_num(raw["waiting"]), _num(raw["running"]), _num(raw["kv"]), _num(raw["lora"]))
    return PodSnapshot(
        address=_str(doc["address"]),
        waiting=_int(doc["waiting"]),
        running=_int(doc["running"]),
        kv_cache_usage=_num(doc["kv"]),
        max_lora=_int(doc["maxLora"]),
        running_adapters=frozenset(_strs(doc["runningAdapters"])),
        waiting_adapters=frozenset(_strs(doc["waitingAdapters"])),
        updated_at=updated_at,
        healthy=bool(doc["healthy"]),
        reason=_str(doc.get("reason", "")),
        field_times=times,
    )


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _strs(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {value!r}")
    return [_str(v) for v in value]


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _num(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)
