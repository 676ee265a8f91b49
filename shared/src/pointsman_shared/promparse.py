"""A targeted reader of the Prometheus text exposition format.

It reads only the lines of the metric names asked for (found with ``bytes.find``, not by tokenizing
the whole page), because a vLLM page is 15-80 KB of histograms of which Pointsman needs four gauges.
Each wanted line is checked whole by one compiled regular expression, once: a line seen before (a pod
serves mostly the same lines scrape after scrape) is not checked again. Its labels are split into a dict
only when someone asks for them, because most readers need the value alone.

A page is read as UTF-8 bytes, as it comes off the socket: decoding all of it to text would cost more
than finding the few lines wanted (a fresh 50 KB string per scrape). Text is accepted too, and encoded.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable
from typing import NamedTuple


class PromParseError(ValueError):
    """A line of a wanted metric that does not follow the exposition format."""


# A quoted label value, written as an unrolled loop. Possessive quantifiers (``*+``) never backtrack:
# a line either matches in one pass or is malformed, which makes the check about 4x faster.
_QUOTED = r'"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"'
_PAIR = r"[ \t]*+[a-zA-Z_][a-zA-Z0-9_]*+[ \t]*+=[ \t]*+" + _QUOTED + r"[ \t]*+"
# After the metric name: an optional label set (a trailing comma allowed), a value, an optional timestamp.
# On UTF-8 bytes: a byte of a multi-byte character is never a quote, backslash or newline.
_REST = re.compile(
    (
        r"(?:\{((?>" + _PAIR + r",)*+(?>" + _PAIR + r")?+[ \t]*+)\})?+"
        r"[ \t]*+([^ \t\r]++)(?:[ \t]++[^ \t\r]++)?+[ \t]*+\r?"
    ).encode()
)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\\n]*(?:\\.[^"\\\n]*)*)"')
_ESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_AFTER_NAME = (b"{", b" ", b"\t")
_NEWLINE = ord("\n")


class Sample(NamedTuple):
    """One sample line: its label set as written (between the braces, already checked) and its value."""

    label_text: str
    value: float

    @property
    def labels(self) -> dict[str, str]:
        return parse_labels(self.label_text)


def parse_labels(label_text: str) -> dict[str, str]:
    """A sample's label set, as written between its braces (checked when the sample was read)."""
    return {key: _unescape(value) for key, value in _LABEL.findall(label_text)}


def read_samples(page: str | bytes, names: Iterable[str]) -> dict[str, list[Sample]]:
    """Return the samples of each wanted metric name (an empty list when the page has none)."""
    text = as_bytes(page)
    return {name: read_family(text, name) for name in names}


def as_bytes(page: str | bytes) -> bytes:
    """The page as UTF-8 bytes, which the readers take: encode a page once to read several names."""
    return page.encode() if isinstance(page, str) else page


def read_family(page: str | bytes, metric: str) -> list[Sample]:
    """Return the samples of one metric name, in page order (an empty list when the page has none).

    The exposition format keeps all lines of a metric together, so reading stops at the first line
    after them: the rest of the page is never scanned for a name that was found.
    """
    text = as_bytes(page)
    name = metric.encode()
    start = _first_line(text, name)
    return [] if start < 0 else _read_lines(text, metric, name, start)


def read_last_family(page: str | bytes, metric: str) -> list[Sample]:
    """:func:`read_family`, searching from the end of the page: for a family servers write last (an
    info gauge after the histograms), found without scanning the page from the start."""
    text = as_bytes(page)
    name = metric.encode()
    size = len(name)
    line_start = b"\n" + name
    i = text.rfind(line_start)
    while i >= 0 and text[i + 1 + size : i + 2 + size] not in _AFTER_NAME:
        i = text.rfind(line_start, 0, i)
    if i < 0:
        return read_family(text, metric) if text.startswith(name) else []
    # Back to the family's first line: the lines of a metric are written together.
    start = i + 1
    while (before := text.rfind(b"\n", 0, start - 1) + 1) < start - 1 and text.startswith(name, before):
        if text[before + size : before + size + 1] not in _AFTER_NAME:
            break
        start = before
    return _read_lines(text, metric, name, start)


def read_first_family(page: str | bytes, metrics: tuple[str, ...]) -> tuple[str, list[Sample]] | None:
    """The samples of whichever of ``metrics`` (names of one number) comes first on the page, and its
    name; ``None`` when the page has none of them.

    One scan for all the names instead of one each: a page without the first name is not searched to
    its end before the others are looked for. Names that end alike (``vllm:kv_cache_usage_perc``,
    ``vllm:gpu_cache_usage_perc``) are found by searching for their common ending.
    """
    text = as_bytes(page)
    names, suffix = _names_and_ending(metrics)
    if len(names) < 2 or not suffix:
        return _first_on_page(text, metrics)
    i = text.find(suffix)
    while i >= 0:
        end = i + len(suffix)
        if text[end : end + 1] in _AFTER_NAME:
            for metric, name in zip(metrics, names, strict=True):
                start = end - len(name)
                if (
                    start >= 0
                    and text.startswith(name, start)
                    and (start == 0 or text[start - 1] == _NEWLINE)
                ):
                    return metric, _read_lines(text, metric, name, start)
        i = text.find(suffix, end)
    return None


@functools.lru_cache(maxsize=64)
def _names_and_ending(metrics: tuple[str, ...]) -> tuple[tuple[bytes, ...], bytes]:
    """The names as bytes, and the longest ending they all share."""
    names = tuple(metric.encode() for metric in metrics)
    shortest = min(names, key=len, default=b"")
    size = len(shortest)
    while size and not all(name.endswith(shortest[len(shortest) - size :]) for name in names):
        size -= 1
    return names, shortest[len(shortest) - size :]


def _first_on_page(text: bytes, metrics: tuple[str, ...]) -> tuple[str, list[Sample]] | None:
    found = []
    for metric in metrics:
        name = metric.encode()
        if (start := _first_line(text, name)) >= 0:
            found.append((start, metric, name))
    if not found:
        return None
    start, metric, name = min(found)
    return metric, _read_lines(text, metric, name, start)


def _first_line(text: bytes, name: bytes) -> int:
    """Where the first sample line of ``name`` starts, or -1."""
    size = len(name)
    # Only a sample line of exactly this name counts: not "# HELP name" (searching for the name at a
    # line start skips comments at C speed), not "name_total".
    line_start = b"\n" + name
    if text.startswith(name):
        i = 0
    else:
        i = text.find(line_start) + 1
        if i == 0:
            return -1
    while text[i + size : i + size + 1] not in _AFTER_NAME:
        i = text.find(line_start, i + size) + 1
        if i == 0:
            return -1
    return i


def _read_lines(text: bytes, metric: str, name: bytes, i: int) -> list[Sample]:
    """The sample lines of ``name`` from ``i``, the start of its first one."""
    size = len(name)
    samples: list[Sample] = []
    while True:
        end = text.find(b"\n", i)
        if end < 0:
            end = len(text)
        rest = text[i + size : end]
        samples.append(
            _seen_sample(metric, rest) if len(rest) <= _CACHED_LINE else _parse_sample(metric, rest)
        )
        i = end + 1
        if not text.startswith(name, i) or text[i + size : i + size + 1] not in _AFTER_NAME:
            return samples


# A pod serves mostly the lines it served last time (its LoRA series, idle queues, the same counts):
# a line seen before is not checked again. A hit (the slice and the lookup) costs a fifth of a check.
# Lines up to 512 bytes, 16,384 of them: at most ~21 MB (measured), ~6 lines of each pod of a large pool
# with room for their changes. A malformed line raises and is not cached, so it fails every page it is on.
_CACHED_LINE = 512


def _parse_sample(name: str, rest: bytes) -> Sample:
    """One sample line, after the metric name ``name``."""
    match = _REST.fullmatch(rest)
    if match is None:
        line = rest[:120].decode(errors="replace")
        raise PromParseError(f"{name}: malformed sample line {line!r}")
    labels, value = match.groups()
    try:
        number = float(value)
    except ValueError:
        raise PromParseError(f"{name}: value {value.decode(errors='replace')!r} is not a number") from None
    try:
        return Sample(labels.decode() if labels else "", number)
    except UnicodeDecodeError:
        raise PromParseError(f"{name}: labels are not UTF-8") from None


_seen_sample = functools.lru_cache(maxsize=16384)(_parse_sample)


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), m.group(0)), value)


def is_finite(value: float) -> bool:
    return math.isfinite(value)
