"""``POST /control``: pins for deterministic tests and injected faults.

The body has a ``"pin"`` key, a ``"fault"`` key or both; each replaces what it names, ``null`` clears it.

Pins are fixed values that override what the ``/metrics`` page reports (scheduling is unaffected);
every key is optional:

    {"pin": {"waiting": 12, "running": 3, "kvCacheUsage": 0.5,
             "runningAdapters": ["sql-lora"], "waitingAdapters": [], "maxLora": 4}}

Faults make the pod misbehave the ways real pods do; every key is optional:

    {"fault": {"metricsDelayMs": 300,     # /metrics answers this late
               "metricsStatus": 503,      # /metrics answers with this HTTP status
               "metricsMalformed": true,  # /metrics serves a page that does not parse
               "inferenceStatus": 500,    # completions and chat answer with this HTTP status
               "paused": true,            # the engine stops stepping (requests queue, none finish)
               "dropConnections": true}}  # every response is cut off after its headers
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from pointsman_sim.metrics import Load

_T = TypeVar("_T")


class ControlError(ValueError):
    """The ``/control`` body is not a valid pin request."""


@dataclass(frozen=True, slots=True)
class Pins:
    waiting: int | None = None
    running: int | None = None
    kv_cache_usage: float | None = None
    running_adapters: frozenset[str] | None = None
    waiting_adapters: frozenset[str] | None = None
    max_lora: int | None = None

    @property
    def pins_lora(self) -> bool:
        return any(v is not None for v in (self.running_adapters, self.waiting_adapters, self.max_lora))

    def apply(self, load: Load) -> Load:
        pinned = {f.name: v for f in dataclasses.fields(self) if (v := getattr(self, f.name)) is not None}
        return dataclasses.replace(load, **pinned)

    def to_json(self) -> dict[str, object]:
        """The pins as ``/control`` takes them (only the keys that are set)."""
        out: dict[str, object] = {}
        for key, (attr, _) in _KEYS.items():
            value = getattr(self, attr)
            if value is not None:
                out[key] = sorted(value) if isinstance(value, frozenset) else value
        return out


def _count(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ControlError(f"pin.{key} must be a non-negative integer, got {value!r}")
    return value


def _fraction(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ControlError(f"pin.{key} must be a number from 0 to 1, got {value!r}")
    if math.isnan(value):
        raise ControlError(f"pin.{key} must be a number from 0 to 1, got NaN")
    return float(value)


def _adapters(key: str, value: object) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v and "," not in v for v in value):
        raise ControlError(f"pin.{key} must be a list of adapter names (no commas), got {value!r}")
    return frozenset(value)


@dataclass(frozen=True, slots=True)
class Faults:
    metrics_delay_ms: int | None = None
    metrics_status: int | None = None
    metrics_malformed: bool = False
    inference_status: int | None = None
    paused: bool = False
    drop_connections: bool = False

    def to_json(self) -> dict[str, object]:
        """The faults as ``/control`` takes them (only the keys that are set)."""
        defaults = Faults()
        return {
            key: getattr(self, attr)
            for key, (attr, _) in _FAULT_KEYS.items()
            if getattr(self, attr) != getattr(defaults, attr)
        }


@dataclass(frozen=True, slots=True)
class ControlChange:
    """What one ``/control`` body changes: pins, faults or both (``None``: clear them)."""

    sets_pins: bool
    pins: Pins | None
    sets_faults: bool
    faults: Faults | None


def _flag(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ControlError(f"fault.{key} must be true or false, got {value!r}")
    return value


def _status(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 400 <= value <= 599:
        raise ControlError(f"fault.{key} must be an HTTP error status 400-599, got {value!r}")
    return value


def _delay(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 600_000:
        raise ControlError(f"fault.{key} must be milliseconds from 0 to 600000, got {value!r}")
    return value


_FAULT_KEYS: dict[str, tuple[str, Callable[[str, object], object]]] = {
    "metricsDelayMs": ("metrics_delay_ms", _delay),
    "metricsStatus": ("metrics_status", _status),
    "metricsMalformed": ("metrics_malformed", _flag),
    "inferenceStatus": ("inference_status", _status),
    "paused": ("paused", _flag),
    "dropConnections": ("drop_connections", _flag),
}

# JSON key -> (Pins attribute, validator)
_KEYS: dict[str, tuple[str, Callable[[str, object], object]]] = {
    "waiting": ("waiting", _count),
    "running": ("running", _count),
    "kvCacheUsage": ("kv_cache_usage", _fraction),
    "runningAdapters": ("running_adapters", _adapters),
    "waitingAdapters": ("waiting_adapters", _adapters),
    "maxLora": ("max_lora", _count),
}


def parse_control(body: object) -> ControlChange:
    """What a ``/control`` body asks for; raise :class:`ControlError`."""
    if not isinstance(body, dict) or not body or not set(body) <= {"pin", "fault"}:
        raise ControlError('the body must be {"pin": {...} | null, "fault": {...} | null} (either or both)')
    pins = _parse_object(body, "pin", _KEYS, Pins)
    faults = _parse_object(body, "fault", _FAULT_KEYS, Faults)
    return ControlChange("pin" in body, pins, "fault" in body, faults)


def _parse_object(
    body: dict[str, object],
    name: str,
    keys: dict[str, tuple[str, Callable[[str, object], object]]],
    kind: Callable[..., _T],
) -> _T | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ControlError(f"{name} must be an object or null, got {value!r}")
    unknown = sorted(set(value) - set(keys))
    if unknown:
        raise ControlError(f"unknown {name} keys {unknown}; known: {sorted(keys)}")
    return kind(**{keys[key][0]: keys[key][1](key, item) for key, item in value.items()})
