"""The cluster objects' Redis encoding (cluster_codec)."""

from __future__ import annotations

import orjson
import pytest

from pointsman_shared.cluster import (
    ClusterObjective,
    ClusterObjects,
    ClusterRewrite,
    Refused,
    RewriteRule,
    RewriteTarget,
    WatchState,
)
from pointsman_shared.cluster_codec import (
    CLUSTER_CODEC_VERSION,
    ClusterCodecError,
    cluster_to_dict,
    decode_cluster,
    encode_cluster,
    stamp,
)

GIE = "inference.networking.x-k8s.io/v1alpha2"
OBJECTS = ClusterObjects(
    objectives=(ClusterObjective("batch", GIE, 3, -1),),
    rewrites=(
        ClusterRewrite(
            "canary",
            "llm-d.ai/v1alpha2",
            2,
            "2026-12-01T00:00:00Z",
            (
                RewriteRule(("m",), (RewriteTarget("m-v1", 90), RewriteTarget("m-v2", 10))),
                RewriteRule((), (RewriteTarget("fallback", None),)),
            ),
        ),
    ),
    refused=(Refused("InferenceModelRewrite", "mixed", GIE, 1, "set a weight on every target or on none"),),
    watches=(WatchState("InferenceObjective", "llm-d.ai/v1alpha2", "absent", "HTTP 404"),),
)


def test_objects_round_trip() -> None:
    assert decode_cluster(encode_cluster(OBJECTS)) == OBJECTS
    assert decode_cluster(encode_cluster(ClusterObjects())) == ClusterObjects()


def test_the_blob_s_layout() -> None:
    # Changing these bytes changes the wire: bump CLUSTER_CODEC_VERSION with it.
    doc = orjson.loads(encode_cluster(OBJECTS))
    assert doc == {"codec": 1, **cluster_to_dict(OBJECTS)}
    assert doc["rewrites"][0]["rules"][0] == {
        "models": ["m"],
        "targets": [{"model": "m-v1", "weight": 90}, {"model": "m-v2", "weight": 10}],
    }
    assert CLUSTER_CODEC_VERSION == 1


def test_the_same_objects_make_the_same_stamp() -> None:
    assert stamp(encode_cluster(OBJECTS)) == stamp(encode_cluster(decode_cluster(encode_cluster(OBJECTS))))
    assert stamp(encode_cluster(OBJECTS)) != stamp(encode_cluster(ClusterObjects()))


@pytest.mark.parametrize(
    ("blob", "why"),
    [
        (b"not json", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"codec": 2}', "not supported"),
        (b'{"codec": true}', "not supported"),
        (b'{"codec": 1}', "miss or mistype"),
        (b'{"codec":1,"objectives":[{"name":"a","apiVersion":"v","generation":1,"priority":"1"}],'
         b'"rewrites":[],"refused":[],"watches":[]}', "miss or mistype"),
        (b'{"codec":1,"objectives":[],"rewrites":[],"refused":[],'
         b'"watches":[{"kind":"InferenceObjective","apiVersion":"v","status":"asleep","detail":""}]}',
         "miss or mistype"),
    ],
)  # fmt: skip
def test_a_blob_this_reader_does_not_understand_is_refused(blob: bytes, why: str) -> None:
    with pytest.raises(ClusterCodecError, match=why):
        decode_cluster(blob)
