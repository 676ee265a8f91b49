"""A targeted reader of the Prometheus text exposition format.

It reads only the lines of the metric names asked for (found with ``str.find``, not by tokenizing the
whole page), because a vLLM page is 15-80 KB of histograms of which Pointsman needs four gauges.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


class PromParseError(ValueError):
    """A line of a wanted metric that does not follow the exposition format."""


@dataclass(frozen=True, slots=True)
class Sample:
    labels: dict[str, str]
    value: float


def read_samples(text: str, names: Iterable[str]) -> dict[str, list[Sample]]:
    """Return the samples of each wanted metric name (an empty list when the page has none)."""
    found: dict[str, list[Sample]] = {}
    for name in names:
        samples: list[Sample] = []
        start = 0
        while (i := text.find(name, start)) >= 0:
            end = text.find("\n", i)
            if end < 0:
                end = len(text)
            start = end
            # Only a sample line of exactly this name counts: not "# HELP name", not "name_total".
            if i > 0 and text[i - 1] != "\n":
                continue
            rest = text[i + len(name) : end]
            if rest[:1] not in ("{", " ", "\t"):
                continue
            samples.append(_parse_sample(name, rest))
        found[name] = samples
    return found


def _parse_sample(name: str, rest: str) -> Sample:
    labels: dict[str, str] = {}
    pos = 0
    if rest.startswith("{"):
        pos = _parse_labels(name, rest, labels)
    fields = rest[pos:].split()
    if not fields or len(fields) > 2:
        raise PromParseError(f"{name}: expected a value and an optional timestamp, got {rest[pos:]!r}")
    try:
        value = float(fields[0])
    except ValueError:
        raise PromParseError(f"{name}: value {fields[0]!r} is not a number") from None
    return Sample(labels, value)


def _parse_labels(name: str, rest: str, labels: dict[str, str]) -> int:
    """Parse ``{a="x",b="y"}`` from the start of ``rest``; return the index after ``}``."""
    pos = 1
    n = len(rest)
    while True:
        while pos < n and rest[pos] in " \t":
            pos += 1
        if pos < n and rest[pos] == "}":
            return pos + 1
        eq = rest.find("=", pos)
        if eq < 0:
            raise PromParseError(f"{name}: unterminated label set")
        key = rest[pos:eq].strip()
        if not key.isidentifier():
            raise PromParseError(f"{name}: bad label name {key!r}")
        if eq + 1 >= n or rest[eq + 1] != '"':
            raise PromParseError(f"{name}: label {key} has no quoted value")
        value, pos = _parse_quoted(name, rest, eq + 2)
        labels[key] = value
        if pos < n and rest[pos] == ",":
            pos += 1
        elif pos < n and rest[pos] == "}":
            return pos + 1
        else:
            raise PromParseError(f"{name}: expected ',' or '}}' after label {key}")


_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _parse_quoted(name: str, rest: str, pos: int) -> tuple[str, int]:
    """Parse a label value whose opening quote is before ``pos``; return it and the index after it."""
    close = rest.find('"', pos)
    if close < 0:
        raise PromParseError(f"{name}: unterminated label value")
    if rest.find("\\", pos, close) < 0:
        return rest[pos:close], close + 1
    out: list[str] = []
    while pos < len(rest):
        ch = rest[pos]
        if ch == '"':
            return "".join(out), pos + 1
        if ch == "\\" and pos + 1 < len(rest):
            out.append(_ESCAPES.get(rest[pos + 1], "\\" + rest[pos + 1]))
            pos += 2
            continue
        out.append(ch)
        pos += 1
    raise PromParseError(f"{name}: unterminated label value")


def is_finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))
