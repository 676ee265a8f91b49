from __future__ import annotations

import pytest

from pointsman_shared.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("50ms", 0.05),
        ("2s", 2.0),
        ("1.5s", 1.5),
        ("1m", 60.0),
        ("250us", 0.00025),
        (" 10 ms ", 0.01),
        (3, 3.0),
    ],
)
def test_parse(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text",
    # None and later: found by test_config_properties (TypeError, OverflowError, or an infinite duration).
    [
        "",
        "50",
        "fast",
        "5 parsecs",
        "-1s",
        True,
        None,
        [],
        10**400,
        float("inf"),
        float("nan"),
        "9" * 400 + "s",
    ],
)
def test_refused(text: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize("seconds", [0.05, 2.0, 0.001, 1.5])
def test_format_round_trips(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)
