from __future__ import annotations

import pytest

from pointsman_sim.control import ControlChange, ControlError, Faults, Pins, parse_control
from pointsman_sim.metrics import Load

LIVE = Load(
    waiting=1,
    running=2,
    kv_cache_usage=0.25,
    running_adapters=frozenset({"a"}),
    waiting_adapters=frozenset(),
    max_lora=4,
)


@pytest.mark.parametrize(
    ("body", "pins"),
    [
        pytest.param({"pin": None}, None, id="clear"),
        pytest.param({"pin": {}}, Pins(), id="empty"),
        pytest.param(
            {"pin": {"waiting": 12, "kvCacheUsage": 1}}, Pins(waiting=12, kv_cache_usage=1.0), id="some"
        ),
        pytest.param(
            {
                "pin": {
                    "waiting": 0,
                    "running": 3,
                    "kvCacheUsage": 0.5,
                    "runningAdapters": ["x", "y"],
                    "waitingAdapters": [],
                    "maxLora": 2,
                }
            },
            Pins(0, 3, 0.5, frozenset({"x", "y"}), frozenset(), 2),
            id="all",
        ),
    ],
)
def test_parse_control(body: object, pins: Pins | None) -> None:
    assert parse_control(body) == ControlChange(True, pins, False, None)


@pytest.mark.parametrize(
    ("body", "change"),
    [
        pytest.param({"fault": None}, ControlChange(False, None, True, None), id="clear"),
        pytest.param(
            {"fault": {"metricsDelayMs": 300, "metricsStatus": 503, "paused": True}},
            ControlChange(False, None, True, Faults(metrics_delay_ms=300, metrics_status=503, paused=True)),
            id="some",
        ),
        pytest.param(
            {
                "pin": {"waiting": 1},
                "fault": {"inferenceStatus": 500, "dropConnections": True, "metricsMalformed": True},
            },
            ControlChange(
                True,
                Pins(waiting=1),
                True,
                Faults(inference_status=500, drop_connections=True, metrics_malformed=True),
            ),
            id="pins-and-faults",
        ),
    ],
)
def test_parse_control_faults(body: object, change: ControlChange) -> None:
    assert parse_control(body) == change


def test_faults_round_trip_through_json() -> None:
    faults = Faults(metrics_delay_ms=10, paused=True)
    assert faults.to_json() == {"metricsDelayMs": 10, "paused": True}
    assert parse_control({"fault": faults.to_json()}).faults == faults


@pytest.mark.parametrize(
    "body",
    [
        pytest.param([], id="not-an-object"),
        pytest.param({}, id="no-pin"),
        pytest.param({"pin": {}, "extra": 1}, id="extra-key"),
        pytest.param({"pin": 3}, id="pin-not-object"),
        pytest.param({"pin": {"queue": 1}}, id="unknown-key"),
        pytest.param({"pin": {"waiting": -1}}, id="negative"),
        pytest.param({"pin": {"running": 1.5}}, id="fractional-count"),
        pytest.param({"pin": {"running": True}}, id="bool-count"),
        pytest.param({"pin": {"kvCacheUsage": 1.5}}, id="kv-above-one"),
        pytest.param({"pin": {"runningAdapters": "a,b"}}, id="adapters-as-string"),
        pytest.param({"pin": {"waitingAdapters": ["a,b"]}}, id="adapter-with-comma"),
        pytest.param({"fault": {"metricsStatus": 200}}, id="status-not-an-error"),
        pytest.param({"fault": {"paused": 1}}, id="flag-not-bool"),
        pytest.param({"fault": {"metricsDelayMs": -5}}, id="negative-delay"),
        pytest.param({"fault": {"slow": True}}, id="unknown-fault"),
        pytest.param({"fault": []}, id="fault-not-object"),
    ],
)
def test_parse_control_rejects(body: object) -> None:
    with pytest.raises(ControlError):
        parse_control(body)


def test_pins_override_only_what_they_name() -> None:
    pinned = Pins(waiting=9, waiting_adapters=frozenset({"b"})).apply(LIVE)
    assert pinned == Load(9, 2, 0.25, frozenset({"a"}), frozenset({"b"}), 4)


def test_pins_round_trip_through_json() -> None:
    pins = Pins(running=3, running_adapters=frozenset({"y", "x"}), max_lora=1)
    assert pins.to_json() == {"running": 3, "runningAdapters": ["x", "y"], "maxLora": 1}
    assert parse_control({"pin": pins.to_json()}).pins == pins
