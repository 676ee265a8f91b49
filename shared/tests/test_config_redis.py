"""The config's ``redis`` section: a URL of any form, Sentinel spelled out, ``cluster: true``; every error
names its path (the rest of config.py: test_config.py)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from pointsman_shared.config import ConfigError, parse_config
from pointsman_shared.redis_url import Cluster, Sentinel, Standalone


def _problems(doc: dict[str, Any], environ: dict[str, str] | None = None) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as excinfo:
        parse_config(doc, environ=environ)
    return excinfo.value.problems


def test_the_default_is_one_local_server() -> None:
    redis = parse_config({}).redis
    assert redis.target == Standalone("redis://127.0.0.1:6379/0")
    assert (redis.sentinel, redis.cluster) == (None, False)


@pytest.mark.parametrize(
    ("redis", "target"),
    [
        ({"url": "rediss://h:6380/1"}, Standalone("rediss://h:6380/1")),
        (
            {"url": "redis+sentinel://:pw@s1,s2:26380/pointsman/2"},
            Sentinel(master_name="pointsman", hosts=(("s1", 26379), ("s2", 26380)), db=2, password="pw"),
        ),
        ({"url": "redis+cluster://n1:7000,n2:7000"}, Cluster(nodes=(("n1", 7000), ("n2", 7000)))),
        ({"url": "redis://n1:7000", "cluster": True}, Cluster(nodes=(("n1", 7000),))),
        (
            {
                "sentinel": {
                    "masterName": "pointsman",
                    "hosts": ["s1", "s2:5000", "[fd00::1]"],
                    "db": 1,
                    "username": "app",
                    "password": "p@ss:word",
                    "sentinelPassword": "watch",
                    "tls": True,
                }
            },
            Sentinel(
                master_name="pointsman",
                hosts=(("s1", 26379), ("s2", 5000), ("fd00::1", 26379)),
                db=1,
                username="app",
                password="p@ss:word",
                sentinel_password="watch",
                tls=True,
            ),
        ),
    ],
)
def test_each_form_names_its_target(redis: dict[str, Any], target: object) -> None:
    assert parse_config({"redis": redis}).redis.target == target


def test_redis_url_from_the_environment_may_be_a_sentinel_url() -> None:
    # The Helm chart's redis.mode sentinel: REDIS_URL, from its Secret.
    url = "redis+sentinel://:s3cret@sentinel-0.sentinel:26379,sentinel-1.sentinel:26379/pointsman/2"
    target = parse_config({}, environ={"REDIS_URL": url}).redis.target
    assert isinstance(target, Sentinel)
    assert target.master_name == "pointsman"
    assert target.db == 2


@pytest.mark.parametrize(
    ("doc", "environ", "path", "message"),
    [
        ({"redis": {"url": "http://x"}}, None, "redis.url", "must start with redis://"),
        ({"redis": {"url": "redis+sentinel://s1"}}, None, "redis.url", "name the primary"),
        ({"redis": {"url": "redis+cluster://n1/2"}}, None, "redis.url", "database 0 only"),
        ({}, {"REDIS_URL": "redis+sentinel://s1:port/m"}, "redis.url", "bad host:port"),
        ({"redis": {"url": "unix:///x.sock", "cluster": True}}, None, "redis.cluster", "over TCP"),
        (
            {"redis": {"url": "redis+sentinel://s1/m", "cluster": True}},
            None,
            "redis.cluster",
            "not a cluster",
        ),
        ({"redis": {"sentinel": {"hosts": ["s1"]}}}, None, "redis.sentinel.masterName", "required"),
        ({"redis": {"sentinel": {"masterName": "m"}}}, None, "redis.sentinel.hosts", "required"),
        (
            {"redis": {"sentinel": {"masterName": "m", "hosts": []}}},
            None,
            "redis.sentinel.hosts",
            "at least 1",
        ),
        (
            {"redis": {"sentinel": {"masterName": "m", "hosts": ["s1", "s2:x"]}}},
            None,
            "redis.sentinel.hosts[1]",
            "bad port",
        ),
        (
            {"redis": {"sentinel": {"masterName": "m", "hosts": ["s1", "s1:26379"]}}},
            None,
            "redis.sentinel.hosts[1]",
            "listed twice",
        ),
        (
            {"redis": {"sentinel": {"masterName": "m", "hosts": ["s"], "port": 1}}},
            None,
            "redis.sentinel.port",
            "",
        ),
        (
            {"redis": {"sentinel": {"masterName": "m", "hosts": ["s"]}, "url": "redis://h"}},
            None,
            "redis.url",
            "not both",
        ),
        (
            {"redis": {"sentinel": {"masterName": "m", "hosts": ["s"]}}},
            {"REDIS_URL": "redis://h"},
            "redis.url",
            "REDIS_URL",
        ),
        (
            {"redis": {"sentinel": {"masterName": "m", "hosts": ["s"]}, "cluster": True}},
            None,
            "redis.cluster",
            "not a cluster",
        ),
    ],
)
def test_errors_name_the_path(
    doc: dict[str, Any], environ: dict[str, str] | None, path: str, message: str
) -> None:
    problems = _problems(doc, environ)
    assert any(p == path and message in m for p, m in problems), problems


def test_no_error_shows_a_password() -> None:
    problems = _problems({"redis": {"url": "redis+sentinel://:hunter2@s1:x/m"}})
    assert "hunter2" not in str(problems)


def test_a_dumped_config_loads_again() -> None:
    # The local stack writes the config it derives this way (model_dump, then load).
    for redis in (
        {"url": "redis+sentinel://s1/m"},
        {"url": "redis://n1:7000", "cluster": True},
        {"sentinel": {"masterName": "m", "hosts": ["s1"], "password": "pw"}},
    ):
        config = parse_config({"redis": redis})
        dumped = yaml.safe_load(
            yaml.safe_dump(config.model_dump(mode="json", by_alias=True, exclude_none=True))
        )
        assert parse_config(dumped).redis == config.redis


def test_passwords_stay_out_of_repr_and_display() -> None:
    url = parse_config({"redis": {"url": "redis+sentinel://:hunter2@s1/m"}}).redis
    assert "hunter2" not in url.display
    explicit = parse_config(
        {
            "redis": {
                "sentinel": {"masterName": "m", "hosts": ["s1"], "password": "a1", "sentinelPassword": "b2"}
            }
        }
    ).redis
    assert explicit.display == "Sentinel s1:26379 master m"
    assert "a1" not in repr(explicit)
    assert "b2" not in repr(explicit)
