"""Durations written the way operators write them: ``50ms``, ``2s``, ``1m``, ``1.5s``."""

from __future__ import annotations

import math
import re

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|m|h)\s*$")


def parse_duration(value: object) -> float:
    """Return seconds. A bare number is taken as seconds. Raise ``ValueError`` for anything else (a
    config validator turns only that into an error naming the path), negative or not finite."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"not a duration: {repr(value)[:60]} (use e.g. 50ms, 2s, 1m)")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an integer beyond any float
            raise ValueError("not a duration: the number is too large") from None
    else:
        match = _PATTERN.match(value)
        if match is None:
            raise ValueError(f"not a duration: {repr(value)[:60]} (use e.g. 50ms, 2s, 1m)")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not math.isfinite(seconds):
        raise ValueError(f"a duration must be finite: {repr(value)[:60]}")
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
