"""Which redis-py client each target builds, and with what; no server needed (the real ones:
tests/integration/test_redis_sentinel.py and test_redis_cluster.py)."""

from __future__ import annotations

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from pointsman_shared.redis_client import ClientOptions, SentinelPrimary, create_client
from pointsman_shared.redis_url import Sentinel

OPTIONS = ClientOptions(
    socket_timeout=0.5, connect_timeout=0.25, retry=Retry(NoBackoff(), 2), sentinel_timeout=0.125
)


async def test_a_plain_url_is_one_server() -> None:
    client = create_client("redis://:pw@h:6380/3", OPTIONS)
    try:
        assert type(client) is Redis
        kwargs = client.connection_pool.connection_kwargs
        assert (kwargs["host"], kwargs["port"], kwargs["db"], kwargs["password"]) == ("h", 6380, 3, "pw")
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (0.5, 0.25)
    finally:
        await client.aclose()


async def test_a_sentinel_url_is_the_primary_the_sentinels_name() -> None:
    client = create_client("redis+sentinel://app:pw@s1:1,s2:2/pointsman/3", OPTIONS)
    try:
        assert isinstance(client, SentinelPrimary)
        pool = client.connection_pool
        assert pool.service_name == "pointsman"
        assert pool.is_master
        kwargs = pool.connection_kwargs
        assert (kwargs["db"], kwargs["username"], kwargs["password"]) == (3, "app", "pw")
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (0.5, 0.25)
        assert pool.connection_class.__name__ == "_DemotionAware"
        sentinels = [s.connection_pool.connection_kwargs for s in pool.sentinel_manager.sentinels]
        assert [(s["host"], s["port"]) for s in sentinels] == [("s1", 1), ("s2", 2)]
        # The Sentinels get their own credentials (none here) and the short timeout.
        assert {(s["password"], s["socket_timeout"]) for s in sentinels} == {(None, 0.125)}
    finally:
        await client.aclose()


async def test_the_sentinels_own_password_goes_to_the_sentinels_only() -> None:
    target = Sentinel(
        master_name="m", hosts=(("s1", 1),), password="data", sentinel_password="watch", tls=True
    )
    client = create_client(target, OPTIONS)
    try:
        pool = client.connection_pool
        assert pool.connection_kwargs["password"] == "data"
        assert pool.connection_class.__name__ == "_DemotionAwareSSL"
        (sentinel,) = pool.sentinel_manager.sentinels
        assert sentinel.connection_pool.connection_kwargs["password"] == "watch"
    finally:
        await client.aclose()


async def test_a_cluster_url_is_a_cluster_client() -> None:
    client = create_client("redis+cluster://:pw@n1:7000,n2:7001", OPTIONS)
    try:
        assert isinstance(client, RedisCluster)
        nodes = sorted((n.host, n.port) for n in client.nodes_manager.startup_nodes.values())
        assert nodes == [("n1", 7000), ("n2", 7001)]
        assert client.nodes_manager.connection_kwargs["password"] == "pw"
    finally:
        await client.aclose()
