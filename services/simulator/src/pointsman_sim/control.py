"""Pins: fixed values that override what a pod's ``/metrics`` page reports, for deterministic tests.

``POST /control`` takes ``{"pin": {...}}`` to replace the pins or ``{"pin": null}`` to clear them. Every
key of the pin object is optional; those present override the engine's live numbers on the page only
(scheduling is unaffected):

    {"pin": {"waiting": 12, "running": 3, "kvCacheUsage": 0.5,
             "runningAdapters": ["sql-lora"], "waitingAdapters": [], "maxLora": 4}}
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from pointsman_sim.metrics import Load


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


# JSON key -> (Pins attribute, validator)
_KEYS: dict[str, tuple[str, Callable[[str, object], object]]] = {
    "waiting": ("waiting", _count),
    "running": ("running", _count),
    "kvCacheUsage": ("kv_cache_usage", _fraction),
    "runningAdapters": ("running_adapters", _adapters),
    "waitingAdapters": ("waiting_adapters", _adapters),
    "maxLora": ("max_lora", _count),
}


def parse_control(body: object) -> Pins | None:
    """The pins a ``/control`` body asks for; ``None`` clears them. Raise :class:`ControlError`."""
    if not isinstance(body, dict) or set(body) != {"pin"}:
        raise ControlError('the body must be {"pin": {...}} or {"pin": null}')
    pin = body["pin"]
    if pin is None:
        return None
    if not isinstance(pin, dict):
        raise ControlError(f"pin must be an object or null, got {pin!r}")
    unknown = sorted(set(pin) - set(_KEYS))
    if unknown:
        raise ControlError(f"unknown pin keys {unknown}; known: {sorted(_KEYS)}")
    values = {_KEYS[key][0]: _KEYS[key][1](key, value) for key, value in pin.items()}
    return Pins(**values)  # type: ignore[arg-type]  # the validators give each field its type
