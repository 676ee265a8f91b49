from __future__ import annotations

import pytest

from pointsman_shared.redis_url import (
    Cluster,
    RedisUrlError,
    Sentinel,
    Standalone,
    parse_redis_url,
    redacted,
)


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("redis://127.0.0.1:6379/0", Standalone("redis://127.0.0.1:6379/0")),
        ("rediss://u:p@h:6380/1?ssl_cert_reqs=none", Standalone("rediss://u:p@h:6380/1?ssl_cert_reqs=none")),
        ("unix:///run/redis.sock?db=2", Standalone("unix:///run/redis.sock?db=2")),
        (
            "redis+sentinel://s1:26379,s2:26380,s3/mymaster",
            Sentinel(master_name="mymaster", hosts=(("s1", 26379), ("s2", 26380), ("s3", 26379))),
        ),
        (
            "rediss+sentinel://user:p%40ss@[fd00::1]:5000,10.0.0.2/m%2Fx/3",
            Sentinel(
                master_name="m/x",
                hosts=(("fd00::1", 5000), ("10.0.0.2", 26379)),
                db=3,
                username="user",
                password="p@ss",
                tls=True,
            ),
        ),
        # The Helm chart's rendering: a password without a user.
        (
            "redis+sentinel://:s3cret@sentinel-0.sentinel:26379/pointsman/2",
            Sentinel(
                master_name="pointsman", hosts=(("sentinel-0.sentinel", 26379),), db=2, password="s3cret"
            ),
        ),
        ("redis+sentinel://s1/m/", Sentinel(master_name="m", hosts=(("s1", 26379),))),
        ("redis+cluster://n1:7000,n2:7001", Cluster(nodes=(("n1", 7000), ("n2", 7001)))),
        ("rediss+cluster://:pw@n1/0", Cluster(nodes=(("n1", 6379),), password="pw", tls=True)),
    ],
)
def test_each_form_parses_to_its_target(url: str, target: object) -> None:
    assert parse_redis_url(url) == target


def test_cluster_true_reads_a_plain_url_as_a_start_node() -> None:
    assert parse_redis_url("rediss://u:p@n1:7000/0", cluster=True) == Cluster(
        nodes=(("n1", 7000),), username="u", password="p", tls=True
    )
    assert parse_redis_url("redis+cluster://n1", cluster=True) == Cluster(nodes=(("n1", 6379),))


@pytest.mark.parametrize(
    ("url", "cluster", "message"),
    [
        ("http://h", False, "must start with redis://"),
        ("h:6379", False, "must start with"),
        ("redis+sentinel://s1", False, "name the primary"),
        ("redis+sentinel://s1/", False, "name the primary"),
        ("redis+sentinel:///m", False, "at least one host"),
        ("redis+sentinel://s1/m/0/x", False, "/master_name or /master_name/db"),
        ("redis+sentinel://s1/m/zero", False, "must be a number"),
        ("redis+sentinel://s1:99999/m", False, "bad host:port"),
        ("redis+sentinel://s1:x/m", False, "bad host:port"),
        ("redis+sentinel://s1,,s2/m", False, "empty host"),
        ("redis+sentinel://s1,s1:26379/m", False, "listed twice"),
        ("redis+sentinel://[fd00::1/m", False, "bad host:port"),
        ("redis+sentinel://s1/m?sentinel_password=x", False, "no query options"),
        ("redis+sentinel://s1/m", True, "not a cluster"),
        ("redis+cluster://n1/1", False, "database 0 only"),
        ("unix:///run/redis.sock", True, "over TCP"),
        ("redis://h:port/0", False, "port must be a number"),
        ("redis://h:99999/0", False, "port must be a number"),
        ("redis://h/zero", False, "the database: a number"),
        ("redis://:pass/word@h:6379/0", False, "percent-encode"),
        ("rediss://:pass?word@h/0", False, "percent-encode"),
        ("unix://:pass#word@/run/redis.sock", False, "percent-encode"),
        ("redis+cluster://:pass/word@n1,n2", False, "percent-encode"),
        ("redis+sentinel://:pass?word@s1/m", False, "percent-encode"),
    ],
)
def test_bad_urls_say_why(url: str, cluster: bool, message: str) -> None:
    with pytest.raises(RedisUrlError, match=message):
        parse_redis_url(url, cluster=cluster)


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://:hunter2@s1:bad/m",
        # Unencoded, redis-py would take "hunter" for the port (and say so): refused here first.
        "redis://:hunter/2@h:6379/0",
        "redis+cluster://:hunter/2@n1",
        "redis://:hunter2@h:hunter2/0",
        "redis://:hunter2@h/hunter2",
    ],
)
def test_errors_never_show_the_password(url: str) -> None:
    with pytest.raises(RedisUrlError) as caught:
        parse_redis_url(url)
    assert "hunter" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("rediss://user:pw@h/0", "rediss://user:***@h/0"),
        ("redis+sentinel://:p@ss@s1,s2/m/0", "redis+sentinel://:***@s1,s2/m/0"),
        ("redis+cluster://u:p@n1,n2", "redis+cluster://u:***@n1,n2"),
        ("unix:///run/redis.sock", "unix:///run/redis.sock"),
        ("unix://:pw@/run/redis.sock?db=1", "unix://:***@/run/redis.sock?db=1"),
        ("redis://user@h", "redis://***@h"),
        # Malformed (refused by parse_redis_url), hidden all the same: everything before the last @.
        ("redis://:pw/with?slash#@h:6379/0", "redis://:***@h:6379/0"),
        # redis-py's query options for passwords.
        (
            "rediss://h/0?ssl_ca_certs=/ca.crt&password=pw&ssl_password=pw",
            "rediss://h/0?ssl_ca_certs=/ca.crt&password=***&ssl_password=***",
        ),
    ],
)
def test_redacted_hides_the_password(url: str, shown: str) -> None:
    assert redacted(url) == shown


def test_targets_keep_passwords_out_of_their_repr() -> None:
    target = parse_redis_url("redis+sentinel://:hunter2@s1/m")
    assert "hunter2" not in repr(target)
    assert "hunter2" not in repr(parse_redis_url("redis://:hunter2@h"))
