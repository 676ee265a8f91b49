"""What a model server's ``/metrics`` page says about its load, by metric names given as data.

``read_page`` is pure: page text and a name mapping in, the page's numbers out, with what the page did
not say left as ``None``. Merging with the pod's previous state (the last-known adapter rule) is the
collector's job.
"""

from __future__ import annotations

from dataclasses import dataclass

from pointsman_shared.promparse import PromParseError, Sample, is_finite, read_samples


@dataclass(frozen=True, slots=True)
class MetricNames:
    waiting: str
    running: str
    # Tried in order; the first family present wins (vLLM renamed gpu_cache_usage_perc in 0.12).
    kv_cache_usage: tuple[str, ...]
    lora_info: str | None = None
    max_lora_label: str = "max_lora"
    running_adapters_label: str = "running_lora_adapters"
    waiting_adapters_label: str = "waiting_lora_adapters"

    @property
    def families(self) -> tuple[str, ...]:
        lora = (self.lora_info,) if self.lora_info else ()
        return (self.waiting, self.running, *self.kv_cache_usage, *lora)


PRESETS: dict[str, MetricNames] = {
    "vllm": MetricNames(
        waiting="vllm:num_requests_waiting",
        running="vllm:num_requests_running",
        kv_cache_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        lora_info="vllm:lora_requests_info",
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


def read_page(text: str, names: MetricNames) -> PageMetrics:
    """Raise :class:`MetricsPageError` (reason ``parse`` or ``value``) when the page is unusable."""
    try:
        samples = read_samples(text, names.families)
    except PromParseError as exc:
        raise MetricsPageError("parse", str(exc)) from exc
    kv: float | None = None
    for name in names.kv_cache_usage:
        if samples[name]:
            # Data-parallel servers expose one series per engine: the pod's KV use is their mean.
            kv = _total(name, samples[name]) / len(samples[name])
            break
    lora: LoraState | None = None
    lora_error: str | None = None
    idle_max_lora: int | None = None
    if names.lora_info:
        try:
            lora, idle_max_lora = _newest_lora(samples[names.lora_info], names)
        except MetricsPageError as exc:
            lora_error = exc.reason
    return PageMetrics(
        waiting=_count(names.waiting, samples[names.waiting]),
        running=_count(names.running, samples[names.running]),
        kv_cache_usage=kv,
        lora=lora,
        lora_error=lora_error,
        idle_max_lora=idle_max_lora,
    )


def _total(name: str, samples: list[Sample]) -> float:
    total = 0.0
    for sample in samples:
        if not is_finite(sample.value) or sample.value < 0:
            raise MetricsPageError("value", f"{name} has value {sample.value}")
        total += sample.value
    return total


def _count(name: str, samples: list[Sample]) -> int | None:
    # Data-parallel servers expose one series per engine: queues add up.
    return round(_total(name, samples)) if samples else None


def _newest_lora(samples: list[Sample], names: MetricNames) -> tuple[LoraState | None, int | None]:
    """The series with the largest value (its timestamp) among those naming any adapter; when there is
    none, the newest idle series' max_lora instead."""
    newest: Sample | None = None
    newest_idle: Sample | None = None
    for sample in samples:
        running = sample.labels.get(names.running_adapters_label, "")
        waiting = sample.labels.get(names.waiting_adapters_label, "")
        if not running.strip(" ,") and not waiting.strip(" ,"):
            # An idle server's series says nothing about which adapters are loaded.
            if newest_idle is None or sample.value > newest_idle.value:
                newest_idle = sample
        elif newest is None or sample.value > newest.value:
            newest = sample
    if newest is None:
        return None, (None if newest_idle is None else _max_lora(newest_idle, names))
    state = LoraState(
        max_lora=_max_lora(newest, names),
        running=_adapters(newest.labels.get(names.running_adapters_label, "")),
        waiting=_adapters(newest.labels.get(names.waiting_adapters_label, "")),
    )
    return state, None


def _max_lora(sample: Sample, names: MetricNames) -> int:
    raw = sample.labels.get(names.max_lora_label, "")
    try:
        max_lora = int(raw)
    except ValueError:
        raise MetricsPageError("max_lora", f"max_lora {raw!r} is not an integer") from None
    if max_lora < 0:
        raise MetricsPageError("max_lora", f"max_lora {raw!r} is negative")
    return max_lora


def _adapters(label: str) -> frozenset[str]:
    return frozenset(name for part in label.split(",") if (name := part.strip()))
