"""The versioned encoding of a pool snapshot in Redis (docs/redis-schema.md).

The blob is JSON (orjson). Its ``codec`` field names the layout; a reader refuses layouts it does not
know instead of guessing. The snapshot's ``version`` is stored beside the blob, not inside it, because
Redis assigns it atomically at publish time.
"""

from __future__ import annotations

from typing import Any

import orjson

from pointsman_shared.snapshot import PodSnapshot, PoolSnapshot

CODEC_VERSION = 1


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


def decode_pool(data: bytes, version: int) -> PoolSnapshot:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise CodecError(f"snapshot is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise CodecError("snapshot is not a JSON object")
    codec = doc.get("codec")
    if codec != CODEC_VERSION:
        raise CodecError(f"snapshot codec {codec!r} is not supported (this reader knows {CODEC_VERSION})")
    try:
        return PoolSnapshot(
            pool=_str(doc["pool"]),
            version=version,
            published_at=_num(doc["publishedAt"]),
            pods=tuple(_decode_pod(p) for p in doc["pods"]),
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
    }


def _decode_pod(doc: Any) -> PodSnapshot:
    if not isinstance(doc, dict):
        raise TypeError("pod is not an object")
    return PodSnapshot(
        address=_str(doc["address"]),
        waiting=_int(doc["waiting"]),
        running=_int(doc["running"]),
        kv_cache_usage=_num(doc["kv"]),
        max_lora=_int(doc["maxLora"]),
        running_adapters=frozenset(_strs(doc["runningAdapters"])),
        waiting_adapters=frozenset(_strs(doc["waitingAdapters"])),
        updated_at=_num(doc["updatedAt"]),
        healthy=bool(doc["healthy"]),
        reason=_str(doc.get("reason", "")),
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
