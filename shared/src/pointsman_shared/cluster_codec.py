"""The versioned encoding of a pool's cluster objects in Redis (docs/redis-schema.md), beside the
snapshot and apart from its codec: the two change at their own pace.

The blob is JSON (orjson) with a ``codec`` field naming the layout; a reader refuses a layout it does
not know. :func:`stamp` is the blob's digest: the collector stores it beside the blob, and a picker
reads the blob again only when the stamp changed. The same objects always make the same bytes (every
list sorted, no times), so replicas that see the same cluster write the same stamp.
"""

from __future__ import annotations

import hashlib
from typing import Any, get_args

import orjson

from pointsman_shared.cluster import (
    WATCH_STATES,
    ClusterObjective,
    ClusterObjects,
    ClusterRewrite,
    Kind,
    Refused,
    RewriteRule,
    RewriteTarget,
    WatchState,
)

CLUSTER_CODEC_VERSION = 1
READABLE = (1,)
_KINDS = get_args(Kind)


class ClusterCodecError(ValueError):
    """A blob that is not a set of cluster objects this reader understands."""


def encode_cluster(objects: ClusterObjects) -> bytes:
    return orjson.dumps({"codec": CLUSTER_CODEC_VERSION, **cluster_to_dict(objects)})


def cluster_to_dict(objects: ClusterObjects) -> dict[str, Any]:
    """The JSON form, as the blob holds it and the collector's ``GET /v1/pool`` shows it."""
    return {
        "objectives": [
            {"name": o.name, "apiVersion": o.api_version, "generation": o.generation, "priority": o.priority}
            for o in objects.objectives
        ],
        "rewrites": [
            {
                "name": r.name,
                "apiVersion": r.api_version,
                "generation": r.generation,
                "created": r.created,
                "rules": [
                    {
                        "models": list(rule.models),
                        "targets": [{"model": t.model, "weight": t.weight} for t in rule.targets],
                    }
                    for rule in r.rules
                ],
            }
            for r in objects.rewrites
        ],
        "refused": [
            {
                "kind": x.kind,
                "name": x.name,
                "apiVersion": x.api_version,
                "generation": x.generation,
                "reason": x.reason,
            }
            for x in objects.refused
        ],
        "watches": [
            {"kind": w.kind, "apiVersion": w.api_version, "status": w.status, "detail": w.detail}
            for w in objects.watches
        ],
    }


def stamp(blob: bytes) -> str:
    return hashlib.blake2b(blob, digest_size=12).hexdigest()


def decode_cluster(data: bytes) -> ClusterObjects:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ClusterCodecError(f"cluster objects are not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ClusterCodecError("cluster objects are not a JSON object")
    codec = doc.get("codec")
    if isinstance(codec, bool) or codec not in READABLE:
        raise ClusterCodecError(f"cluster codec {codec!r} is not supported (this reader knows {READABLE})")
    try:
        return ClusterObjects(
            objectives=tuple(
                ClusterObjective(
                    _str(o["name"]), _str(o["apiVersion"]), _int(o["generation"]), _int(o["priority"])
                )
                for o in _list(doc["objectives"])
            ),
            rewrites=tuple(
                ClusterRewrite(
                    _str(r["name"]),
                    _str(r["apiVersion"]),
                    _int(r["generation"]),
                    _str(r["created"]),
                    tuple(
                        RewriteRule(
                            tuple(_str(m) for m in _list(rule["models"])),
                            tuple(
                                RewriteTarget(_str(t["model"]), _opt_int(t["weight"]))
                                for t in _list(rule["targets"])
                            ),
                        )
                        for rule in _list(r["rules"])
                    ),
                )
                for r in _list(doc["rewrites"])
            ),
            refused=tuple(
                Refused(
                    _one_of(x["kind"], _KINDS),
                    _str(x["name"]),
                    _str(x["apiVersion"]),
                    _int(x["generation"]),
                    _str(x["reason"]),
                )
                for x in _list(doc["refused"])
            ),
            watches=tuple(
                WatchState(
                    _one_of(w["kind"], _KINDS),
                    _str(w["apiVersion"]),
                    _one_of(w["status"], WATCH_STATES),
                    _str(w["detail"]),
                )
                for w in _list(doc["watches"])
            ),
        )
    except (KeyError, TypeError) as exc:
        raise ClusterCodecError(f"cluster objects miss or mistype a field: {exc}") from exc


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {value!r}")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _opt_int(value: Any) -> int | None:
    return None if value is None else _int(value)


def _one_of(value: Any, allowed: tuple[str, ...]) -> Any:
    if value not in allowed:
        raise TypeError(f"expected one of {allowed}, got {value!r}")
    return value
