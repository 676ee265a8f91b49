import pytest
from redis.crc import key_slot

from pointsman_shared.keys import RedisKeys


def test_keys_share_one_cluster_slot_per_pool() -> None:
    keys = RedisKeys("pool-a")
    assert keys.snapshot == "pointsman:{pool-a}:snapshot"
    assert keys.sequence == "pointsman:{pool-a}:seq"
    assert keys.channel == "pointsman:{pool-a}:updates"
    assert keys.members == "pointsman:{pool-a}:members"
    assert keys.shards == "pointsman:{pool-a}:shards"
    assert RedisKeys("pool-b").snapshot != keys.snapshot


@pytest.mark.parametrize("name", ["p", "pool-a", 'p"1', "a:b", "default-pool", "a}b"])
def test_a_pool_s_keys_hash_to_one_cluster_slot(name: str) -> None:
    # Redis Cluster's own slot function: the publish scripts touch these keys in one call.
    keys = RedisKeys(name)
    names = [keys.snapshot, keys.sequence, keys.channel, keys.members, keys.shards]
    assert len({key_slot(k.encode()) for k in names}) == 1, names
