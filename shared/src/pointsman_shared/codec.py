"""The versioned encoding of a pool snapshot in Redis (docs/redis-schema.md).

The blob is JSON (orjson). Its ``codec`` field names the layout; a reader refuses layouts it does not
know instead of guessing. Layout 2 added each pod's ``fieldTimes``, layout 3 its prefix cache
(``prefixCacheHitRate``, ``blockSize``, ``numGpuBlocks``). Blobs of older layouts (from a collector not
yet upgraded) still decode: every field time of layout 1 is the pod's ``updatedAt``, and a pod of
layout 1 or 2 has no known prefix cache (hit rate None, sizes 0).
The snapshot's ``version`` is stored beside the blob, not inside it, because Redis assigns it
atomically at publish time.

A pod is written and read by functions made from the fields of ``PodSnapshot`` and ``FieldTimes``: each
field under its name in camelCase (``kv`` for the KV-cache use in the blob), as its type says
(``_WRITE``, ``_READ``). So a field added to a snapshot type is carried with no change here, but it
changes the layout: bump ``CODEC_VERSION`` and fill the field in for older layouts in ``_decode_pod``
(the test of the blob's exact bytes fails until then).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar, get_type_hints

import orjson

from pointsman_shared.snapshot import FieldTimes, PodSnapshot, PoolSnapshot

CODEC_VERSION = 3
# Layouts this reader decodes: a picker upgraded first keeps reading an older collector.
READABLE = (1, 2, 3)


class CodecError(ValueError):
    """A blob that is not a pool snapshot this reader understands."""


def pod_to_dict(pod: PodSnapshot) -> dict[str, Any]:
    """The JSON form of a pod, as the collector's ``GET /v1/pool`` shows it."""
    return _api_pod(pod)


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


def _decode_pod(doc: Any, codec: int) -> PodSnapshot:
    # An older layout's pod gets what the current one added, then is read as the current one.
    if codec < CODEC_VERSION and isinstance(doc, dict):
        if codec == 1:
            # Layout 1 had no field times: every field counts as read at the pod's last good scrape.
            doc["fieldTimes"] = dict.fromkeys(_TIME_KEYS, doc["updatedAt"])
        # Layouts 1 and 2 had no prefix cache: unknown, as for a pod that exports no such metrics.
        doc.update(_NO_PREFIX_CACHE)
    return _read_pod(doc)


# How a pod is written and read, made from its types' fields.

# The types a pod is made of.
T = TypeVar("T", FieldTimes, PodSnapshot)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _strs(value: Any) -> frozenset[str]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {value!r}")
    return frozenset([_str(v) for v in value])


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _num(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def _num_or_none(value: Any) -> float | None:
    return None if value is None else _num(value)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


def _blob_key(name: str) -> str:
    return "kv" if name == "kv_cache_usage" else _camel(name)


# How a field of each type is written (None: as it is) and how it is read back, checked.
_WRITE: dict[object, Callable[[Any], Any] | None] = {
    str: None,
    int: None,
    float: None,
    float | None: None,
    bool: None,
    frozenset[str]: sorted,  # sorted: the same set makes the same bytes
}
_READ: dict[object, Callable[[Any], Any]] = {
    str: _str,
    int: _int,
    float: _num,
    float | None: _num_or_none,
    bool: _bool,
    frozenset[str]: _strs,
}


def _writer(
    cls: type, key: Callable[[str], str], *, derived: bool = False
) -> Callable[[Any], dict[str, Any]]:
    """The function that writes a ``cls`` as a JSON object, its ``derived`` fields too if asked."""
    namespace: dict[str, Any] = {}
    items: list[str] = []
    for f in fields(cls):
        if f.init or derived:
            write = namespace[f"write_{f.name}"] = _for_type(_WRITE, cls, f.name)
            value = f"obj.{f.name}" if write is None else f"write_{f.name}(obj.{f.name})"
            items.append(f"{key(f.name)!r}: {value}")
    made: Callable[[Any], dict[str, Any]] = _compile(
        f"def made(obj):\n    return {{{', '.join(items)}}}", namespace
    )
    return made


def _reader(cls: type[T]) -> Callable[[Any], T]:
    """The function that reads a ``cls`` from the JSON object :func:`_writer` made, checking each field."""
    namespace: dict[str, Any] = {"cls": cls, "not_an_object": _not_an_object}
    values: list[str] = []
    for f in fields(cls):
        if f.init:
            namespace[f"read_{f.name}"] = _for_type(_READ, cls, f.name)
            values.append(f"read_{f.name}(doc[{_blob_key(f.name)!r}])")
    made: Callable[[Any], T] = _compile(
        "def made(doc):\n"
        "    if not isinstance(doc, dict):\n"
        "        not_an_object(doc)\n"
        f"    return cls({', '.join(values)})",
        namespace,
    )
    return made


def _for_type(table: dict[object, Any], cls: type, name: str) -> Any:
    kind = get_type_hints(cls)[name]
    if kind not in table:
        raise TypeError(
            f"{cls.__name__}.{name} is a {kind}, which the codec cannot carry: add it to _WRITE, _READ"
        )
    return table[kind]


def _compile(source: str, namespace: dict[str, Any]) -> Any:
    """The function ``made`` that ``source`` defines. Straight-line code made from the field list, as
    dataclasses makes ``__init__``, costs what code written by hand does; ``dict(zip(keys, values))``
    would cost about 2.5 times as much to write a pod (bench/snapshot_paths.py)."""
    exec(source, namespace)  # the types' own field names: identifiers, not input
    return namespace["made"]


def _not_an_object(doc: Any) -> None:
    raise TypeError(f"expected an object, got {doc!r}")


_WRITE[FieldTimes] = _writer(FieldTimes, _blob_key)
_READ[FieldTimes] = _reader(FieldTimes)
_encode_pod = _writer(PodSnapshot, _blob_key)
_read_pod = _reader(PodSnapshot)
_TIME_KEYS = tuple(_blob_key(f.name) for f in fields(FieldTimes))
_NO_PREFIX_CACHE = {
    _blob_key(f.name): f.default
    for f in fields(PodSnapshot)
    if f.name in ("prefix_cache_hit_rate", "block_size", "num_gpu_blocks")
}

# The API's pod: every field in camelCase, active_adapters too; its field times as the blob writes them.
_api_pod = _writer(PodSnapshot, _camel, derived=True)
