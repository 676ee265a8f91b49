"""Properties of the Redis codec's public functions (``codec.py``): any valid snapshot round-trips; any
bytes another writer left in Redis (random, truncated, flipped, another layout, a field of another type)
decode to a :class:`CodecError` or to a snapshot whose every field has its declared type, never another
exception."""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

import orjson
from hypothesis import event, given
from hypothesis import strategies as st

from pointsman_shared.codec import READABLE, CodecError, PoolEncoder, decode_pool, encode_pod, encode_pool
from pointsman_shared.snapshot import FieldTimes, PodSnapshot, PoolSnapshot

# Values a collector can hold: any text, counts within the codec's 64-bit integers, finite times.
TEXT = st.text(st.characters(codec="utf-8"), max_size=16)
COUNTS = st.integers(min_value=0, max_value=2**63 - 1)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
ADAPTERS = st.frozensets(TEXT, max_size=4)
FIELD_TIMES = st.builds(FieldTimes, waiting=FLOATS, running=FLOATS, kv_cache_usage=FLOATS, lora=FLOATS)
PODS = st.builds(
    PodSnapshot,
    address=TEXT,
    waiting=COUNTS,
    running=COUNTS,
    kv_cache_usage=FLOATS,
    prefix_cache_hit_rate=st.none() | FLOATS,
    block_size=COUNTS,
    num_gpu_blocks=COUNTS,
    max_lora=COUNTS,
    running_adapters=ADAPTERS,
    waiting_adapters=ADAPTERS,
    updated_at=FLOATS,
    healthy=st.booleans(),
    reason=TEXT,
    field_times=FIELD_TIMES,
)
POOLS = st.builds(
    PoolSnapshot,
    pool=TEXT,
    version=st.integers(0, 2**63 - 1),
    published_at=FLOATS,
    pods=st.lists(PODS, max_size=4, unique_by=lambda p: p.address).map(tuple),
)


@given(POOLS)
def test_every_valid_snapshot_round_trips(pool: PoolSnapshot) -> None:
    blob = encode_pool(pool)
    assert decode_pool(blob, pool.version) == pool
    decoded = decode_pool(blob, pool.version)
    assert [p.active_adapters for p in decoded.pods] == [p.active_adapters for p in pool.pods]
    # The publishers' fast path writes the same bytes, and so does assembling the pods one by one.
    assert PoolEncoder().pool(pool) == blob
    assert orjson.loads(blob)["pods"] == [orjson.loads(encode_pod(p)) for p in pool.pods]


@given(POOLS, st.data())
def test_the_reusing_encoder_writes_what_the_function_writes_across_publishes(
    first: PoolSnapshot, data: st.DataObject
) -> None:
    encoder = PoolEncoder()
    pool = first
    for _ in range(3):
        assert encoder.pool(pool) == encode_pool(pool)
        # The next publish: some pods the same objects (not scraped since), some new snapshots of the
        # same addresses, some pods gone, some new.
        kept = [p for p in pool.pods if data.draw(st.booleans())]
        renewed = [dataclasses.replace(p, waiting=data.draw(COUNTS)) for p in pool.pods if p not in kept]
        added = data.draw(st.lists(PODS, max_size=2))
        pods = {p.address: p for p in [*kept, *renewed, *added]}
        pool = dataclasses.replace(pool, pods=tuple(pods.values()))


def typed(value: Any, hint: Any) -> bool:
    """Whether a decoded field value has its declared type (bool is no int here, as in the codec)."""
    if hint is bool:
        return type(value) is bool
    if hint is int:
        return type(value) is int
    if hint is float:
        return type(value) is float
    if hint == float | None:
        return value is None or type(value) is float
    if hint is str:
        return type(value) is str
    if typing.get_origin(hint) is tuple:  # tuple[X, ...]
        return isinstance(value, tuple) and all(typed(v, typing.get_args(hint)[0]) for v in value)
    if typing.get_origin(hint) is frozenset:
        return isinstance(value, frozenset) and all(type(v) is str for v in value)
    if dataclasses.is_dataclass(hint):
        return isinstance(value, hint) and check_fields(value)
    raise AssertionError(f"no check for {hint}")


def check_fields(obj: Any) -> bool:
    hints = typing.get_type_hints(type(obj))
    return all(typed(getattr(obj, f.name), hints[f.name]) for f in dataclasses.fields(obj))


def outcome(data: bytes, version: int = 1) -> PoolSnapshot | None:
    try:
        pool = decode_pool(data, version)
    except CodecError:
        event("refused")
        return None
    event("decoded")
    assert check_fields(pool)  # the pods' fields too
    assert pool.version == version
    return pool


@given(st.binary(max_size=200))
def test_random_bytes_are_a_codec_error_or_a_snapshot(data: bytes) -> None:
    outcome(data)


@st.composite
def damaged_blobs(draw: st.DrawFn) -> bytes:
    blob = bytearray(encode_pool(draw(POOLS)))
    kind = draw(st.sampled_from(["truncate", "flip", "insert", "delete"]))
    event(kind)
    at = draw(st.integers(0, len(blob) - 1))
    if kind == "truncate":
        del blob[at:]
    elif kind == "flip":
        blob[at] ^= 1 << draw(st.integers(0, 7))
    elif kind == "insert":
        blob[at:at] = draw(st.sampled_from([b",", b"]", b"}", b'"', b"1e999", b"null", b"\xff", b"\\"]))
    else:
        del blob[at : at + draw(st.integers(1, 5))]
    return bytes(blob)


@given(damaged_blobs())
def test_a_damaged_blob_is_a_codec_error_or_a_snapshot(data: bytes) -> None:
    outcome(data)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)


def places(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += places(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            found += places(child, (*prefix, i))
    return found


@st.composite
def rewritten_blobs(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A valid blob with one value replaced (or one key removed) anywhere, as another writer might: and
    whether the result is still the same layout with the same JSON types (so it must decode)."""
    doc = orjson.loads(encode_pool(draw(POOLS)))
    path = draw(st.sampled_from(places(doc)[1:]))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    old = parent[path[-1]]
    if isinstance(parent, dict) and draw(st.booleans()):
        del parent[path[-1]]
        same = False
        event("key removed")
    else:
        alike = {bool: st.booleans(), int: COUNTS, float: FLOATS, str: TEXT}.get(type(old))
        if alike is not None and draw(st.booleans()):
            new = draw(alike)  # another value of the same JSON type
        else:
            new = draw(JSON | st.sampled_from([0, 1, 3, "2", True, 2.0, None, [], {}]))
        parent[path[-1]] = new
        same = (
            type(new) is type(old)
            and not isinstance(new, list | dict)
            and path != ("codec",)
            and not (isinstance(new, float) and not math.isfinite(new))  # JSON has no NaN: null
        )
        event("same type" if same else "other type")
    return orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS), same


@given(rewritten_blobs())
def test_a_blob_with_any_value_anywhere_is_refused_unless_its_types_are_right(
    case: tuple[bytes, bool],
) -> None:
    data, same = case
    pool = outcome(data)
    if same:
        assert pool is not None


@given(
    st.sampled_from([0, 3, -1, "2", True, 2.5, None, [2], {"v": 2}]) | st.integers(-(2**63), 2**64 - 1), POOLS
)
def test_a_layout_this_reader_does_not_know_is_refused(codec: Any, pool: PoolSnapshot) -> None:
    doc = orjson.loads(encode_pool(pool))
    doc["codec"] = codec
    data = orjson.dumps(doc)
    decoded = outcome(data)
    if codec in READABLE and not isinstance(codec, bool):
        assert decoded is not None
    else:
        assert decoded is None
