from pointsman_shared.keys import RedisKeys


def test_keys_share_one_cluster_slot_per_pool() -> None:
    keys = RedisKeys("pool-a")
    assert keys.snapshot == "pointsman:{pool-a}:snapshot"
    assert keys.sequence == "pointsman:{pool-a}:seq"
    assert keys.channel == "pointsman:{pool-a}:updates"
    assert keys.members == "pointsman:{pool-a}:members"
    assert keys.shards == "pointsman:{pool-a}:shards"
    assert RedisKeys("pool-b").snapshot != keys.snapshot
