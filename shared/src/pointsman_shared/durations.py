"""Durations written the way operators write them: ``50ms``, ``2s``, ``1m``, ``1.5s``."""

from __future__ import annotations

import re

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|m|h)\s*$")


def parse_duration(value: str | int | float) -> float:
    """Return seconds. A bare number is taken as seconds."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _PATTERN.match(value)
        if match is None:
            raise ValueError(f"not a duration: {value!r} (use e.g. 50ms, 2s, 1m)")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative: {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """The inverse of :func:`parse_duration` for the values config files hold."""
    if seconds >= 1 and float(seconds).is_integer():
        return f"{int(seconds)}s"
    millis = seconds * 1000
    if float(millis).is_integer():
        return f"{int(millis)}ms"
    return f"{seconds}s"
