from __future__ import annotations

from dataclasses import dataclass, replace

import orjson
import pytest
from test_snapshot import slots

from pointsman_shared.codec import (
    CODEC_VERSION,
    CodecError,
    PoolEncoder,
    _writer,
    decode_pool,
    encode_pod,
    encode_pool,
    pod_to_dict,
)
from pointsman_shared.snapshot import FieldTimes, PoolSnapshot
from pointsman_testkit import every_field_set, pod

POOL = PoolSnapshot(
    pool="p",
    version=7,
    published_at=1764000000.25,
    pods=(
        pod(
            waiting=3,
            running=2,
            kv=0.5,
            max_lora=4,
            adapters=frozenset({"b", "a"}),
            waiting_adapters=frozenset({"c"}),
            updated_at=1764000000.0,
            field_times=FieldTimes(1764000000.0, 1764000000.0, 1763999999.5, 1763999990.0),
            prefix_cache_hit_rate=0.375,
            block_size=16,
            num_gpu_blocks=27000,
        ),
        pod(address="[::1]:8001", healthy=False, reason="timeout", updated_at=0.0),
    ),
)


# POOL's blob as codec 3 writes it: what pickers of every version since read, byte for byte.
CODEC_3_BLOB = (
    b'{"codec":3,"pool":"p","publishedAt":1764000000.25,"pods":[{"address":"10.0.0.1:8000","waiting":3,'
    b'"running":2,"kv":0.5,"prefixCacheHitRate":0.375,"blockSize":16,"numGpuBlocks":27000,"maxLora":4,'
    b'"runningAdapters":["a","b"],"waitingAdapters":["c"],"updatedAt":1764000000.0,"healthy":true,'
    b'"reason":"","fieldTimes":{"waiting":1764000000.0,"running":1764000000.0,"kv":1763999999.5,'
    b'"lora":1763999990.0}},{"address":"[::1]:8001","waiting":0,"running":0,"kv":0.0,'
    b'"prefixCacheHitRate":null,"blockSize":0,"numGpuBlocks":0,"maxLora":0,"runningAdapters":[],'
    b'"waitingAdapters":[],"updatedAt":0.0,"healthy":false,"reason":"timeout","fieldTimes":{"waiting":0.0,'
    b'"running":0.0,"kv":0.0,"lora":0.0}}]}'
)

# POOL's blob as codec 2 wrote it (no prefix cache): a picker upgraded first still reads it.
CODEC_2_BLOB = (
    b'{"codec":2,"pool":"p","publishedAt":1764000000.25,"pods":[{"address":"10.0.0.1:8000","waiting":3,'
    b'"running":2,"kv":0.5,"maxLora":4,"runningAdapters":["a","b"],"waitingAdapters":["c"],'
    b'"updatedAt":1764000000.0,"healthy":true,"reason":"","fieldTimes":{"waiting":1764000000.0,'
    b'"running":1764000000.0,"kv":1763999999.5,"lora":1763999990.0}},{"address":"[::1]:8001","waiting":0,'
    b'"running":0,"kv":0.0,"maxLora":0,"runningAdapters":[],"waitingAdapters":[],"updatedAt":0.0,'
    b'"healthy":false,"reason":"timeout","fieldTimes":{"waiting":0.0,"running":0.0,"kv":0.0,"lora":0.0}}]}'
)


def test_the_blob_is_codec_3_byte_for_byte() -> None:
    # A field added to the snapshot changes these bytes: then bump CODEC_VERSION (codec.py's docstring).
    assert encode_pool(POOL) == CODEC_3_BLOB
    assert PoolEncoder().pool(POOL) == CODEC_3_BLOB
    assert decode_pool(CODEC_3_BLOB, 7) == POOL


def test_a_codec_2_blob_still_decodes_with_no_prefix_cache_known() -> None:
    no_prefix = tuple(
        replace(p, prefix_cache_hit_rate=None, block_size=0, num_gpu_blocks=0) for p in POOL.pods
    )
    assert decode_pool(CODEC_2_BLOB, 7) == replace(POOL, pods=no_prefix)


def test_round_trip_keeps_every_field() -> None:
    assert decode_pool(encode_pool(POOL), 7) == POOL
    assert decode_pool(encode_pool(POOL), 7).pods[0].active_adapters == {"a", "b", "c"}


def test_round_trip_carries_every_field_of_the_snapshot_types() -> None:
    # Made from the field list: a field the codec does not write or read fails here.
    pool = replace(POOL, pods=(every_field_set(),))
    (got,) = decode_pool(encode_pool(pool), 7).pods
    assert slots(got) == slots(pool.pods[0])
    assert slots(got.field_times) == slots(pool.pods[0].field_times)


def test_encoding_is_deterministic() -> None:
    assert encode_pool(POOL) == encode_pool(POOL)


def _blob(**changes: object) -> bytes:
    doc = orjson.loads(encode_pool(POOL))
    doc.update(changes)
    return orjson.dumps(doc)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not json", "not JSON"),
        (b"[1]", "not a JSON object"),
        (_blob(codec=CODEC_VERSION + 1), "not supported"),
        (_blob(codec=None), "not supported"),
        (_blob(pods=[{"address": "a"}]), "missing"),
        (_blob(pods=[{**orjson.loads(encode_pool(POOL))["pods"][0], "waiting": "3"}]), "mistypes"),
        (_blob(publishedAt=True), "mistypes"),
        (_blob(codec=True), "not supported"),
        (_blob(pods=[{**orjson.loads(encode_pool(POOL))["pods"][0], "fieldTimes": None}]), "mistypes"),
        (_blob(pods=[{**orjson.loads(encode_pool(POOL))["pods"][0], "healthy": 1}]), "mistypes"),
        (_blob(pods=["10.0.0.1:8000"]), "mistypes"),
        (
            _blob(pods=[{**orjson.loads(encode_pool(POOL))["pods"][0], "prefixCacheHitRate": "0.5"}]),
            "mistypes",
        ),
        (_blob(pods=[{**orjson.loads(encode_pool(POOL))["pods"][0], "blockSize": 16.0}]), "mistypes"),
    ],
    ids=[
        "not json",
        "not an object",
        "newer codec",
        "no codec",
        "missing field",
        "string count",
        "bool time",
        "bool codec",
        "no field times in codec 2",
        "number for health",
        "pod not an object",
        "string hit rate",
        "float block size",
    ],
)
def test_bad_blobs_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(CodecError, match=message):
        decode_pool(data, 1)


def test_pod_to_dict_is_the_api_shape() -> None:
    # Key order as well: the API's JSON is the same bytes as before the codec was made from the fields.
    assert list(pod_to_dict(POOL.pods[0])) == [
        "address",
        "waiting",
        "running",
        "kvCacheUsage",
        "prefixCacheHitRate",
        "blockSize",
        "numGpuBlocks",
        "maxLora",
        "runningAdapters",
        "waitingAdapters",
        "activeAdapters",
        "updatedAt",
        "healthy",
        "reason",
        "fieldTimes",
    ]
    assert pod_to_dict(POOL.pods[0]) == {
        "address": "10.0.0.1:8000",
        "waiting": 3,
        "running": 2,
        "kvCacheUsage": 0.5,
        "prefixCacheHitRate": 0.375,
        "blockSize": 16,
        "numGpuBlocks": 27000,
        "maxLora": 4,
        "runningAdapters": ["a", "b"],
        "waitingAdapters": ["c"],
        "activeAdapters": ["a", "b", "c"],
        "updatedAt": 1764000000.0,
        "healthy": True,
        "reason": "",
        "fieldTimes": {
            "waiting": 1764000000.0,
            "running": 1764000000.0,
            "kv": 1763999999.5,
            "lora": 1763999990.0,
        },
    }


def test_a_codec_1_blob_still_decodes_with_every_field_read_at_its_update_time() -> None:
    # What a collector before codec 2 wrote; a picker upgraded first must keep routing on it.
    blob = (
        b'{"codec":1,"pool":"p","publishedAt":1764000001.0,"pods":[{"address":"10.0.0.1:8000","waiting":3,'
        b'"running":2,"kv":0.5,"maxLora":4,"runningAdapters":["a"],"waitingAdapters":[],'
        b'"updatedAt":1764000000.0,"healthy":true,"reason":""}]}'
    )
    (pod,) = decode_pool(blob, 3).pods
    assert (pod.waiting, pod.kv_cache_usage, pod.running_adapters) == (3, 0.5, {"a"})
    assert (pod.prefix_cache_hit_rate, pod.block_size, pod.num_gpu_blocks) == (None, 0, 0)
    assert pod.field_times == FieldTimes(1764000000.0, 1764000000.0, 1764000000.0, 1764000000.0)


def test_encode_pod_is_one_entry_of_the_pods_array() -> None:
    # Sharing collectors assemble the array from these in Redis; it must be byte-for-byte the same.
    assert [orjson.loads(encode_pod(p)) for p in POOL.pods] == orjson.loads(encode_pool(POOL))["pods"]


def test_pool_encoder_bytes_are_encode_pools_and_a_kept_pod_is_not_encoded_again() -> None:
    encoder = PoolEncoder()
    a, b = replace(POOL.pods[0]), replace(POOL.pods[0], address="b:1", waiting=9)
    first = replace(POOL, pods=(a, b))
    assert encoder.pool(first) == encode_pool(first)
    # The same object is not encoded again: changed behind the encoder's back, it still shows its old
    # bytes (snapshots are frozen; only this test changes one).
    object.__setattr__(a, "waiting", 42)
    assert orjson.loads(encoder.pool(replace(first, published_at=2.0)))["pods"][0]["waiting"] == 3
    # A new snapshot of a pod, even an equal one, is encoded; a departed pod is forgotten.
    second = replace(POOL, pods=(replace(a, waiting=a.waiting), replace(b, waiting=1)), published_at=3.5)
    assert encoder.pool(second) == encode_pool(second)
    assert encoder.pool(replace(POOL, pods=())) == encode_pool(replace(POOL, pods=()))
    assert encoder.pods((b,)) == [encode_pod(b)]


@pytest.mark.parametrize("name", ['quo"te', "ünï", ""], ids=["escape", "non-ascii", "empty"])
def test_pool_encoder_pool_names(name: str) -> None:
    pool = replace(POOL, pool=name)
    assert PoolEncoder().pool(pool) == encode_pool(pool)


def test_a_field_of_a_type_the_codec_cannot_carry_fails_when_the_codec_is_made() -> None:
    @dataclass(frozen=True, slots=True)
    class WithList:
        ports: list[int]

    with pytest.raises(TypeError, match=r"WithList.ports is a list\[int\], which the codec cannot carry"):
        _writer(WithList, str)
