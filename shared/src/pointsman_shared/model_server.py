"""What a model server's ``/metrics`` page says about its load, by metric names given as data.

``read_page`` is pure: a page (UTF-8 bytes as served, or text) and a name mapping in, the page's
numbers out, with what the page did not say left as ``None``. Merging with the pod's previous state (the
last-known adapter rule) is the collector's job.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from pointsman_shared.promparse import (
    PromParseError,
    Sample,
    as_bytes,
    is_finite,
    parse_labels,
    read_family,
    read_first_family,
    read_last_family,
)


@dataclass(frozen=True, slots=True)
class MetricNames:
    waiting: str
    running: str
    # Names of the same number (vLLM renamed gpu_cache_usage_perc in 0.12): whichever comes first on the
    # page is read, so a page without the new name is not searched to its end for it.
    kv_cache_usage: tuple[str, ...]
    lora_info: str | None = None
    max_lora_label: str = "max_lora"
    running_adapters_label: str = "running_lora_adapters"
    waiting_adapters_label: str = "waiting_lora_adapters"
    # Prefix-cache counters in tokens, each under its names (vLLM V1 0.7-0.9 had a gpu_ prefix), and
    # the older engine's gauge of the hit rate itself (vLLM V0; negative when caching is off).
    prefix_cache_queries: tuple[str, ...] = ()
    prefix_cache_hits: tuple[str, ...] = ()
    prefix_cache_hit_rate: str | None = None
    # An info gauge whose labels give the KV block size (tokens) and the number of GPU blocks.
    cache_config_info: str | None = None
    block_size_label: str = "block_size"
    num_gpu_blocks_label: str = "num_gpu_blocks"
    # A part of every prefix-cache family's name: a page without it has none of them.
    prefix_cache_marker: bytes = b""

    @property
    def families(self) -> tuple[str, ...]:
        lora = (self.lora_info,) if self.lora_info else ()
        rate = (self.prefix_cache_hit_rate,) if self.prefix_cache_hit_rate else ()
        config = (self.cache_config_info,) if self.cache_config_info else ()
        return (
            self.waiting,
            self.running,
            *self.kv_cache_usage,
            *lora,
            *self.prefix_cache_queries,
            *self.prefix_cache_hits,
            *rate,
            *config,
        )


PRESETS: dict[str, MetricNames] = {
    "vllm": MetricNames(
        waiting="vllm:num_requests_waiting",
        running="vllm:num_requests_running",
        kv_cache_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        lora_info="vllm:lora_requests_info",
        prefix_cache_queries=("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        prefix_cache_hits=("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        prefix_cache_hit_rate="vllm:gpu_prefix_cache_hit_rate",
        cache_config_info="vllm:cache_config_info",
        prefix_cache_marker=b"prefix_cache_",
    ),
    "sglang": MetricNames(
        waiting="sglang:num_queue_reqs",
        running="sglang:num_running_reqs",
        kv_cache_usage=("sglang:token_usage",),
    ),
}


class MetricsPageError(ValueError):
    """The page cannot be used. ``reason`` is a short, bounded label for counting errors."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class LoraState:
    max_lora: int
    running: frozenset[str]
    waiting: frozenset[str]


@dataclass(frozen=True, slots=True)
class PageMetrics:
    """One page's numbers. ``None`` means the page did not say; keep what was known before.

    ``lora`` is ``None`` both when the family is absent and when every series is idle (both adapter
    labels empty): in either case the previous adapter set and max_lora stand (spec §4).
    ``lora_error`` is set when the LoRA series was unusable (e.g. ``max_lora="2a"``); the other fields
    still count. ``idle_max_lora`` is the ``max_lora`` of the newest series when every series is idle:
    upstream ignores it, which leaves a pod that has not served an adapter yet with no known slots.
    """

    waiting: int | None
    running: int | None
    kv_cache_usage: float | None
    lora: LoraState | None
    lora_error: str | None = None
    idle_max_lora: int | None = None
    prefix_cache: PrefixCounters | None = None
    """The prefix-cache counters (every engine's together); None: the page has none."""
    prefix_cache_hit_rate: float | None = None
    """The older engines' gauge of the hit rate itself, 0..1; None: no gauge, or caching off."""
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    """Every engine's KV blocks together (each engine of a data-parallel pod has its own cache)."""


@dataclass(frozen=True, slots=True)
class PrefixCounters:
    """Tokens looked up in the prefix cache and tokens found, since the server started."""

    queries: float
    hits: float


def read_page(page: str | bytes, names: MetricNames) -> PageMetrics:
    """Raise :class:`MetricsPageError` (reason ``parse`` or ``value``) when the page is unusable."""
    text = as_bytes(page)
    try:
        waiting = read_family(text, names.waiting)
        running = read_family(text, names.running)
        kv: float | None = None
        if found := read_first_family(text, names.kv_cache_usage):
            name, samples = found
            # Data-parallel servers expose one series per engine: the pod's KV use is their mean.
            kv = _total(name, samples) / len(samples)
        lora_samples = read_family(text, names.lora_info) if names.lora_info else []
        # One search tells whether the page has any prefix-cache family (vLLM's share this part of
        # their names): a page without them is scanned once for all three, not once each.
        prefix: PrefixCounters | None = None
        rate: float | None = None
        if names.prefix_cache_marker and names.prefix_cache_marker in text:
            prefix = _prefix_counters(text, names)
            rate = _hit_rate(text, names.prefix_cache_hit_rate) if names.prefix_cache_hit_rate else None
        block_size, num_gpu_blocks = (
            _cache_config(tuple(s.label_text for s in read_last_family(text, names.cache_config_info)), names)
            if names.cache_config_info
            else (None, None)
        )
    except PromParseError as exc:
        raise MetricsPageError("parse", str(exc)) from exc
    lora: LoraState | None = None
    lora_error: str | None = None
    idle_max_lora: int | None = None
    if lora_samples:
        try:
            lora, idle_max_lora = _newest_lora(lora_samples, names)
        except MetricsPageError as exc:
            lora_error = exc.reason
    return PageMetrics(
        waiting=_count(names.waiting, waiting),
        running=_count(names.running, running),
        kv_cache_usage=kv,
        lora=lora,
        lora_error=lora_error,
        idle_max_lora=idle_max_lora,
        prefix_cache=prefix,
        prefix_cache_hit_rate=rate,
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
    )


def _prefix_counters(text: bytes, names: MetricNames) -> PrefixCounters | None:
    if not names.prefix_cache_queries or not names.prefix_cache_hits:
        return None
    queries = read_first_family(text, names.prefix_cache_queries)
    hits = read_first_family(text, names.prefix_cache_hits)
    if queries is None or hits is None:
        return None
    return PrefixCounters(_total(*queries), _total(*hits))


def _hit_rate(text: bytes, name: str) -> float | None:
    samples = read_family(text, name)
    # Each engine's own rate: their mean. V0 reports -1 with caching off: no rate to tell.
    if not samples or any(not is_finite(s.value) or s.value < 0 for s in samples):
        return None
    return min(1.0, sum(s.value for s in samples) / len(samples))


# The same label sets page after page: split once.
@functools.lru_cache(maxsize=1024)
def _cache_config(label_texts: tuple[str, ...], names: MetricNames) -> tuple[int | None, int | None]:
    """The block size of the first series and the blocks of every engine's series together; a label
    that is no count leaves that number unsaid."""
    samples = label_texts
    block_size: int | None = None
    blocks: int | None = 0
    for i, label_text in enumerate(samples):
        labels = parse_labels(label_text)
        if i == 0:
            block_size = _label_count(labels.get(names.block_size_label))
        count = _label_count(labels.get(names.num_gpu_blocks_label))
        blocks = None if count is None or blocks is None else blocks + count
    return block_size, (blocks or None) if samples else None


def _label_count(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if 0 < value <= _MAX_COUNT else None


# No queue or slot count is larger (a float holds every integer up to here), and the snapshot codec
# writes 64-bit integers only: a larger count would fail every publish of the whole pool.
_MAX_COUNT = 2**53


def _total(name: str, samples: list[Sample]) -> float:
    total = 0.0
    for sample in samples:
        if not is_finite(sample.value) or sample.value < 0:
            raise MetricsPageError("value", f"{name} has value {sample.value}")
        total += sample.value
    if not is_finite(total):  # finite values can add up to infinity
        raise MetricsPageError("value", f"{name} adds up to {total}")
    return total


def _count(name: str, samples: list[Sample]) -> int | None:
    if not samples:
        return None
    # Data-parallel servers expose one series per engine: queues add up.
    total = _total(name, samples)
    if total > _MAX_COUNT:
        raise MetricsPageError("value", f"{name} has value {total:g}, more than any count")
    return round(total)


def _newest_lora(samples: list[Sample], names: MetricNames) -> tuple[LoraState | None, int | None]:
    """The series with the largest value (its timestamp) among those naming any adapter; when there is
    none, the newest idle series' max_lora instead.

    Series are visited newest first (page order among equal values), so usually only the newest one's
    labels are ever read, and a label set seen before is not split again: label parsing was most of
    the cost of a page.
    """
    newest_idle: str | None = None
    for sample in sorted(samples, key=_age_key):
        state, max_lora = _series(sample.label_text, names)
        if state is not None:
            return state, None
        # An idle server's series says nothing about which adapters are loaded.
        if newest_idle is None:
            newest_idle = max_lora
    return None, (None if newest_idle is None else _max_lora(newest_idle))


# A server keeps one series per adapter set it has reported; the newest is mostly one seen before.
@functools.lru_cache(maxsize=1024)
def _series(label_text: str, names: MetricNames) -> tuple[LoraState | None, str]:
    """One LoRA series: its state (``None`` when it names no adapter) and its max_lora as written."""
    labels = parse_labels(label_text)
    running = labels.get(names.running_adapters_label, "")
    waiting = labels.get(names.waiting_adapters_label, "")
    max_lora = labels.get(names.max_lora_label, "")
    if running.strip(" ,") or waiting.strip(" ,"):
        return LoraState(_max_lora(max_lora), _adapters(running), _adapters(waiting)), max_lora
    return None, max_lora


def _age_key(sample: Sample) -> float:
    # Newest first; a series whose timestamp is not a number is older than any.
    return -sample.value if is_finite(sample.value) else math.inf


def _max_lora(raw: str) -> int:
    try:
        max_lora = int(raw)
    except ValueError:
        raise MetricsPageError("max_lora", f"max_lora {raw!r} is not an integer") from None
    if max_lora < 0:
        raise MetricsPageError("max_lora", f"max_lora {raw!r} is negative")
    if max_lora > _MAX_COUNT:
        raise MetricsPageError("max_lora", f"max_lora {raw[:30]!r} is too large")
    return max_lora


def _adapters(label: str) -> frozenset[str]:
    return frozenset(name for part in label.split(",") if (name := part.strip()))
