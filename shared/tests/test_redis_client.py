"""Which redis-py client each target builds, and with what; no server needed (the real ones:
tests/integration/test_redis_sentinel.py and test_redis_cluster.py)."""

from __future__ import annotations

import asyncio
import contextlib

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from pointsman_shared.redis_client import ClientOptions, SentinelPrimary, create_client
from pointsman_shared.redis_url import Sentinel

# A RESP3 server's answers (redis-py 8 speaks RESP3: HELLO 3).
REPLIES = {b"HELLO": b"%1\r\n+proto\r\n:3\r\n", b"PING": b"+PONG\r\n"}
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


async def test_a_caller_bounded_client_has_no_socket_timeout_and_no_retries() -> None:
    client = create_client("redis://h:6380", ClientOptions.caller_bounded(0.75))
    try:
        kwargs = client.connection_pool.connection_kwargs
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (None, 0.75)
        assert kwargs["retry"].get_retries() == 0
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


async def test_a_new_connection_sends_auth_and_nothing_the_acl_users_lack() -> None:
    # What a connection says before the first command, to a fake server: HELLO with AUTH only (no
    # CLIENT SETINFO, which the ACL users of deploy/redis/users.acl are not granted).
    heard: list[bytes] = []

    async def fake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                count = int((await reader.readline())[1:])
                words: list[bytes] = []
                for _ in range(count):
                    size = int((await reader.readline())[1:])
                    words.append((await reader.readexactly(size + 2))[:-2])
                heard.append(b" ".join(words))
                writer.write(REPLIES.get(words[0].upper(), b"+OK\r\n"))
                await writer.drain()

    server = await asyncio.start_server(fake, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = create_client(f"redis://app:pw@127.0.0.1:{port}/0", OPTIONS)
    try:
        assert await client.ping()
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()
    assert heard == [b"HELLO 3 AUTH app pw", b"PING"]
