"""``picker.http2`` (``h2grpc/config.py``): checked by the picker, each bad value named by its path."""

from __future__ import annotations

from typing import Any

import pytest

from pointsman_picker.h2grpc.config import Http2Budget, Http2Config
from pointsman_picker.server import checked
from pointsman_shared.config import ConfigError, parse_config


def test_an_empty_section_is_every_default() -> None:
    assert Http2Config.of({}) == Http2Config()
    assert Http2Config().max_concurrent_streams == 100
    assert Http2Config().pings == Http2Budget(burst=100, per_second=10)


def test_the_keys_users_write_are_camel_case_and_durations_parse() -> None:
    config = Http2Config.of(
        {
            "maxConcurrentStreams": 50,
            "initialWindowSize": 65_535,
            "idleTimeout": "5m",
            "maxConnectionAge": None,
            "emptyFrames": {"burst": 10, "perSecond": 0.5},
        }
    )
    assert config.max_concurrent_streams == 50
    assert config.initial_window_size == 65_535
    assert config.idle_timeout == 300.0
    assert config.empty_frames == Http2Budget(burst=10, per_second=0.5)


@pytest.mark.parametrize(
    ("section", "path", "message"),
    [
        ({"maxConcurrentStreams": 0}, "picker.http2.maxConcurrentStreams", "greater than or equal to 1"),
        ({"maxHeaderListSize": 512}, "picker.http2.maxHeaderListSize", "greater than or equal to 1024"),
        ({"initialWindowSize": 2**31}, "picker.http2.initialWindowSize", "less than or equal to 2147483647"),
        ({"handshakeTimeout": 0}, "picker.http2.handshakeTimeout", "greater than 0"),
        ({"pings": {"burst": 0, "perSecond": 1}}, "picker.http2.pings.burst", "greater than or equal to 1"),
        ({"resets": {"burst": 1}}, "picker.http2.resets.perSecond", "Field required"),
        (
            {"settings": {"burst": 1, "perSecond": float("inf")}},
            "picker.http2.settings.perSecond",
            "finite number",
        ),
        ({"maxStreamPerRead": 3}, "picker.http2.maxStreamPerRead", "Extra inputs are not permitted"),
    ],
)
def test_a_bad_value_is_named_by_its_path(section: dict[str, Any], path: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Http2Config.of(section, "picker.yaml")
    ((where, what),) = raised.value.problems
    assert where == path
    assert message in what
    assert raised.value.source == "picker.yaml"


def test_the_picker_refuses_a_config_file_with_a_bad_section_the_collector_does_not_read() -> None:
    config = parse_config({"picker": {"http2": {"maxConnections": 0, "pings": {"burst": 0, "perSecond": 1}}}})
    with pytest.raises(ConfigError) as raised:
        checked(config, "pointsman.yaml")
    assert [path for path, _ in raised.value.problems] == [
        "picker.http2.maxConnections",
        "picker.http2.pings.burst",
    ]
    assert str(raised.value).startswith("invalid config pointsman.yaml:\n  picker.http2.maxConnections: ")


def test_the_section_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({"picker": {"http2": [1]}})
    assert [path for path, _ in raised.value.problems] == ["picker.http2"]
