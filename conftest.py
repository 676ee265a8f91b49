"""Fixtures every package's tests share: a real Redis on a free port, started once per session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from pointsman_devstack.redis_server import RedisServer, running_redis

# Property tests (the ``*_properties.py`` files): "ci", the default, runs the same examples every time
# (derandomized, no example database on disk, no deadline to trip on a slow runner) and keeps the whole
# set to seconds. `pytest --hypothesis-profile=thorough` searches ten times longer, with fresh randomness.
settings.register_profile(
    "ci",
    max_examples=100,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("thorough", settings.get_profile("ci"), max_examples=1000, derandomize=False)
settings.load_profile("ci")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real Redis: a container when Docker answers, else a local redis-server binary.

    REDIS_URL is ignored here on purpose: tests flush what they write and must not touch a user's server.
    """
    environ = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    with running_redis(environ) as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session's Redis, emptied before each test."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    try:
        client.flushall()
    finally:
        client.close()
    return redis_server.url
