"""The ``/metrics`` page, in the exact text vLLM serves (names, HELP texts, label sets, number format).

Rendered by hand rather than through prometheus_client registries: every collector scrapes every pod
every 50 ms, so the page is built from a few precomputed line prefixes and the current numbers.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import utils as prometheus_utils

from pointsman_sim.engine import BLOCK_SIZE, FinishedRequest, StepResult, Totals

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Numbers as prometheus_client (and so vLLM) writes them: 3.0, 1.76400001225e+09, +Inf.
_number: Callable[[float], str] = prometheus_utils.floatToGoString

# vLLM's bucket bounds for these histograms (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

# A newly current LoRA combination is stamped at least this much after the previous newest, so it is
# the newest series even when the wall clock has not moved (or moved back) since.
_LORA_TICK_S = 0.001


@dataclass(frozen=True, slots=True)
class Load:
    """What the page's gauges say about the pod's load."""

    waiting: int
    running: int
    kv_cache_usage: float
    running_adapters: frozenset[str]
    waiting_adapters: frozenset[str]
    max_lora: int


def labels(pairs: Mapping[str, str]) -> str:
    """``{a="1",b="2"}`` with names sorted, as vLLM's pages show them."""
    body = ",".join(f'{name}="{_escape(pairs[name])}"' for name in sorted(pairs))
    return "{" + body + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _header(name: str, kind: str, help_text: str) -> str:
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"


METRICS_VERSIONS = ("current", "v0")
"""``current``: vLLM >= 0.12 names; ``v0``: the older ones (``vllm:gpu_cache_usage_perc``,
``vllm:time_per_output_token_seconds``)."""

LORA_LABEL_SEMANTICS = ("v0", "current")
"""How ``vllm:lora_requests_info`` fills its adapter labels. ``v0``: running adapters in
``running_lora_adapters``, waiting ones in ``waiting_lora_adapters``; ``current`` (vLLM V1): both
labels list the same set, every adapter with a running or waiting request."""


class LoraInfoSeries:
    """``vllm:lora_requests_info``: one series per label combination ever current.

    vLLM never removes a combination; it sets the current one's value to the unix time, so the newest
    value marks the current combination.
    """

    NAME = "vllm:lora_requests_info"

    def __init__(self, semantics: str = "v0") -> None:
        if semantics not in LORA_LABEL_SEMANTICS:
            raise ValueError(f"unknown lora_requests_info semantics {semantics!r}")
        self._same_set = semantics == "current"
        self._stamps: dict[str, float] = {}  # rendered label set -> unix time it was last current
        self._current: str | None = None
        self._newest = float("-inf")

    def observe(
        self, max_lora: int, running: Iterable[str], waiting: Iterable[str], unix_time: float
    ) -> None:
        if self._same_set:
            running = waiting = {*running, *waiting}
        key = labels(
            {
                "max_lora": str(max_lora),
                "running_lora_adapters": ",".join(sorted(running)),
                "waiting_lora_adapters": ",".join(sorted(waiting)),
            }
        )
        floor = self._newest if key == self._current else self._newest + _LORA_TICK_S
        stamp = max(unix_time, floor)
        self._stamps[key] = stamp
        self._current = key
        self._newest = stamp

    def render(self) -> str:
        if not self._stamps:
            return ""
        lines = [_header(self.NAME, "gauge", "Running stats on lora requests.")]
        lines.extend(f"{self.NAME}{key} {_number(stamp)}\n" for key, stamp in self._stamps.items())
        return "".join(lines)


class Histogram:
    """A Prometheus histogram with fixed buckets and fixed labels, rendered like prometheus_client."""

    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...], base: Mapping[str, str]):
        self._bounds = buckets
        self._counts = [0] * (len(buckets) + 1)  # per bucket, not cumulative; the last is +Inf
        self._sum = 0.0
        bounds = [_number(b) for b in (*buckets, float("inf"))]
        self._header = _header(name, "histogram", help_text)
        self._bucket_prefixes = [f"{name}_bucket{labels({**base, 'le': le})} " for le in bounds]
        self._count_prefix = f"{name}_count{labels(base)} "
        self._sum_prefix = f"{name}_sum{labels(base)} "

    def observe(self, value: float, times: int = 1) -> None:
        """Record ``value`` (``times`` times)."""
        # Prometheus buckets are upper-inclusive: le="0.5" counts 0.5.
        self._counts[bisect.bisect_left(self._bounds, value)] += times
        self._sum += value * times

    def render(self) -> str:
        lines = [self._header]
        cumulative = 0
        for prefix, count in zip(self._bucket_prefixes, self._counts, strict=True):
            cumulative += count
            lines.append(f"{prefix}{_number(cumulative)}\n")
        lines.append(f"{self._count_prefix}{_number(cumulative)}\n")
        lines.append(f"{self._sum_prefix}{_number(self._sum)}\n")
        return "".join(lines)


class PodMetrics:
    """Everything one pod's page shows that is not read live from the engine."""

    def __init__(
        self,
        model_name: str,
        num_gpu_blocks: int,
        *,
        version: str = "current",
        lora_semantics: str = "v0",
        prefix_caching: bool = True,
    ) -> None:
        if version not in METRICS_VERSIONS:
            raise ValueError(f"unknown metrics version {version!r}")
        self._v0 = version == "v0"
        self._prefix_caching = prefix_caching
        if version == "v0":
            self._kv_name, kv_help = (
                "vllm:gpu_cache_usage_perc",
                "GPU KV-cache usage. 1 means 100 percent usage.",
            )
            itl_name, itl_help = (
                "vllm:time_per_output_token_seconds",
                "Histogram of time per output token in seconds.",
            )
        else:
            self._kv_name, kv_help = "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
            itl_name, itl_help = (
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
            )
        self._kv_header = _header(self._kv_name, "gauge", kv_help)
        base = {"engine": "0", "model_name": model_name}
        self._labels = labels(base)
        self._success_labels = {
            reason: labels({**base, "finished_reason": reason}) for reason in ("abort", "length", "stop")
        }
        self._cache_config = labels(
            {
                "block_size": str(BLOCK_SIZE),
                "cache_dtype": "auto",
                "enable_prefix_caching": str(prefix_caching),
                "engine": "0",
                "gpu_memory_utilization": "0.9",
                "num_gpu_blocks": str(num_gpu_blocks),
            }
        )
        self.lora_info = LoraInfoSeries(lora_semantics)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
            base,
        )
        self.itl = Histogram(itl_name, itl_help, ITL_BUCKETS, base)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            E2E_BUCKETS,
            base,
        )

    def observe_step(self, result: StepResult) -> None:
        # A token that follows its request's previous one by a step: that step's duration apart.
        if result.later_tokens:
            self.itl.observe(result.duration, result.later_tokens)
        for finished in result.finished:
            self.observe_finished(finished)

    def observe_finished(self, request: FinishedRequest) -> None:
        self.ttft.observe(request.time_to_first_token)
        self.e2e.observe(request.e2e_latency)

    def render(self, load: Load, totals: Totals) -> str:
        """The page; the LoRA family lists the combinations observed so far (none: no family)."""
        m = self._labels
        success = self._success_labels
        return "".join(
            (
                _header(
                    "vllm:num_requests_running", "gauge", "Number of requests in model execution batches."
                ),
                _sample("vllm:num_requests_running", m, load.running),
                _header("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
                _sample("vllm:num_requests_waiting", m, load.waiting),
                self._kv_header,
                _sample(self._kv_name, m, load.kv_cache_usage),
                # Where vLLM registers them: right after the KV gauge.
                self._prefix_cache(totals),
                self.lora_info.render(),
                _header("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed."),
                _sample("vllm:prompt_tokens_total", m, totals.prompt_tokens),
                _header("vllm:generation_tokens_total", "counter", "Number of generation tokens processed."),
                _sample("vllm:generation_tokens_total", m, totals.generation_tokens),
                _header(
                    "vllm:num_preemptions_total",
                    "counter",
                    "Cumulative number of preemption from the engine.",
                ),
                _sample("vllm:num_preemptions_total", m, totals.preemptions),
                _header("vllm:request_success_total", "counter", "Count of successfully processed requests."),
                _sample("vllm:request_success_total", success["abort"], totals.aborted),
                _sample("vllm:request_success_total", success["length"], totals.finished),
                _sample("vllm:request_success_total", success["stop"], 0),
                self.ttft.render(),
                self.itl.render(),
                self.e2e.render(),
                _header("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig"),
                _sample("vllm:cache_config_info", self._cache_config, 1),
            )
        )

    def _prefix_cache(self, totals: Totals) -> str:
        """vLLM V1's token counters; V0's gauge instead: hits over queries since the start, in blocks
        (the simulator's hits are whole blocks, so the token ratio is the same), -1 when disabled."""
        m = self._labels
        if self._v0:
            if not self._prefix_caching:
                rate = -1.0
            else:
                rate = (
                    totals.prefix_cache_hits / totals.prefix_cache_queries
                    if totals.prefix_cache_queries
                    else 0.0
                )
            return _header(
                "vllm:gpu_prefix_cache_hit_rate", "gauge", "GPU prefix cache block hit rate."
            ) + _sample("vllm:gpu_prefix_cache_hit_rate", m, rate)
        return "".join(
            (
                _header(
                    "vllm:prefix_cache_queries_total",
                    "counter",
                    "Prefix cache queries, in terms of number of queried tokens.",
                ),
                _sample("vllm:prefix_cache_queries_total", m, totals.prefix_cache_queries),
                _header(
                    "vllm:prefix_cache_hits_total",
                    "counter",
                    "Prefix cache hits, in terms of number of cached tokens.",
                ),
                _sample("vllm:prefix_cache_hits_total", m, totals.prefix_cache_hits),
            )
        )


def _sample(name: str, label_text: str, value: float) -> str:
    return f"{name}{label_text} {_number(value)}\n"
