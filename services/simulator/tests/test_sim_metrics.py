from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from pointsman_shared.model_server import PRESETS, LoraState, read_page
from pointsman_shared.promparse import read_samples
from pointsman_sim.engine import FinishedRequest, StepResult, Totals
from pointsman_sim.metrics import Histogram, Load, LoraInfoSeries, PodMetrics

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "tests" / "data" / "vllm-metrics"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
VLLM = PRESETS["vllm"]


def load(
    waiting: int = 0,
    running: int = 0,
    kv: float = 0.0,
    running_adapters: tuple[str, ...] = (),
    waiting_adapters: tuple[str, ...] = (),
    max_lora: int = 4,
) -> Load:
    return Load(waiting, running, kv, frozenset(running_adapters), frozenset(waiting_adapters), max_lora)


TOTALS = Totals(prompt_tokens=120, generation_tokens=40, finished=3, aborted=1, preemptions=2)


def page(*loads: Load, unix_time: float = 1_764_000_000.0) -> str:
    """The page after each load was current in turn (one second apart); the last is current."""
    metrics = PodMetrics(MODEL, num_gpu_blocks=26_500)
    for i, current in enumerate(loads):
        metrics.lora_info.observe(
            current.max_lora, current.running_adapters, current.waiting_adapters, unix_time + i
        )
    return metrics.render(loads[-1], TOTALS)


@pytest.mark.parametrize(
    ("loads", "waiting", "running", "kv", "lora"),
    [
        pytest.param(
            [
                load(
                    waiting=7,
                    running=3,
                    kv=0.4375,
                    running_adapters=("sql-lora", "tweet-summary-1"),
                    max_lora=2,
                )
            ],
            7,
            3,
            0.4375,
            LoraState(2, frozenset({"sql-lora", "tweet-summary-1"}), frozenset()),
            id="busy-with-adapters",
        ),
        pytest.param(
            [
                load(running=1, running_adapters=("a",)),
                load(running=2, running_adapters=("a",), waiting_adapters=("b",)),
            ],
            0,
            2,
            0.0,
            LoraState(4, frozenset({"a"}), frozenset({"b"})),
            id="newest-combination-wins",
        ),
        pytest.param(
            [load(running=1, running_adapters=("a",)), load()],
            0,
            0,
            0.0,
            LoraState(4, frozenset({"a"}), frozenset()),
            id="idle-newest-series-is-skipped-by-the-reader",
        ),
        pytest.param(
            [
                load(running=1, running_adapters=("b",)),
                load(running=1, running_adapters=("a",)),
                load(running=1, running_adapters=("b",)),
            ],
            0,
            1,
            0.0,
            LoraState(4, frozenset({"b"}), frozenset()),
            id="combination-current-again",
        ),
    ],
)
def test_page_reads_back_with_the_collector_parser(
    loads: list[Load], waiting: int, running: int, kv: float, lora: LoraState
) -> None:
    result = read_page(page(*loads), VLLM)
    assert (result.waiting, result.running, result.kv_cache_usage) == (waiting, running, kv)
    assert result.lora == lora
    assert result.lora_error is None


def test_no_lora_family_until_a_combination_is_observed() -> None:
    text = PodMetrics(MODEL, num_gpu_blocks=100).render(load(waiting=2), TOTALS)
    assert "vllm:lora_requests_info" not in text
    assert read_page(text, VLLM).lora is None


def test_every_combination_stays_and_the_idle_one_is_newest_when_idle() -> None:
    text = page(load(running_adapters=("a",)), load(running_adapters=("a", "b")), load())
    samples = read_samples(text, ["vllm:lora_requests_info"])["vllm:lora_requests_info"]
    assert len(samples) == 3
    newest = max(samples, key=lambda s: s.value)
    assert newest.labels == {"max_lora": "4", "running_lora_adapters": "", "waiting_lora_adapters": ""}
    assert {s.labels["running_lora_adapters"] for s in samples} == {"a", "a,b", ""}


@pytest.mark.parametrize(
    "clock",
    [
        pytest.param([5.0, 5.0, 5.0], id="clock-stands-still"),
        pytest.param([5.0, 4.0, 3.0], id="clock-goes-back"),
    ],
)
def test_current_combination_is_always_the_newest(clock: list[float]) -> None:
    series = LoraInfoSeries()
    for adapters, now in zip([("a",), ("b",), ("a",)], clock, strict=True):
        series.observe(1, adapters, (), now)
    samples = read_samples(series.render(), ["vllm:lora_requests_info"])["vllm:lora_requests_info"]
    assert max(samples, key=lambda s: s.value).labels["running_lora_adapters"] == "a"


def test_help_and_type_lines_match_real_vllm() -> None:
    ours = _headers(page(load(running_adapters=("a",))))
    theirs = _headers((FIXTURES / "vllm-current-lora.txt").read_text())
    shared = ours.keys() & theirs.keys()
    assert {
        "vllm:num_requests_running",
        "vllm:lora_requests_info",
        "vllm:time_to_first_token_seconds",
    } <= shared
    assert {name: ours[name] for name in shared} == {name: theirs[name] for name in shared}


def _headers(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if match := re.match(r"# (?:HELP|TYPE) (\S+)", line):
            found.setdefault(match[1], []).append(line)
    return found


def test_sample_lines_use_vllm_label_sets() -> None:
    text = page(load(waiting=1, running_adapters=("a",), max_lora=2))
    assert f'vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} 1.0\n' in text
    assert f'vllm:prompt_tokens_total{{engine="0",model_name="{MODEL}"}} 120.0\n' in text
    assert f'vllm:generation_tokens_total{{engine="0",model_name="{MODEL}"}} 40.0\n' in text
    assert (
        f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="{MODEL}"}} 3.0\n'
        in text
    )
    assert (
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a",waiting_lora_adapters=""} 1.764e+09\n'
        in text
    )


def test_histogram_buckets_are_cumulative_and_upper_inclusive() -> None:
    histogram = Histogram("h", "A histogram.", (0.1, 1.0), {"engine": "0"})
    for value in (0.05, 0.1, 0.5, 7.0):
        histogram.observe(value)
    assert histogram.render().splitlines()[2:] == [
        'h_bucket{engine="0",le="0.1"} 2.0',
        'h_bucket{engine="0",le="1.0"} 3.0',
        'h_bucket{engine="0",le="+Inf"} 4.0',
        'h_count{engine="0"} 4.0',
        'h_sum{engine="0"} 7.65',
    ]


def test_finished_requests_feed_ttft_and_e2e() -> None:
    metrics = PodMetrics(MODEL, num_gpu_blocks=100)
    metrics.observe_finished(
        FinishedRequest("r", 10, 5, arrived_at=1.0, first_token_at=1.03, finished_at=3.0)
    )
    samples = read_samples(
        metrics.render(load(), TOTALS),
        ["vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_sum"],
    )
    assert samples["vllm:time_to_first_token_seconds_count"][0].value == 1.0
    assert samples["vllm:e2e_request_latency_seconds_sum"][0].value == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("version", "present", "absent"),
    [
        pytest.param(
            "current",
            {"vllm:kv_cache_usage_perc", "vllm:inter_token_latency_seconds"},
            {"vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds"},
            id="current",
        ),
        pytest.param(
            "v0",
            {"vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds"},
            {"vllm:kv_cache_usage_perc", "vllm:inter_token_latency_seconds"},
            id="v0",
        ),
    ],
)
def test_metrics_version_picks_the_names(version: str, present: set[str], absent: set[str]) -> None:
    text = PodMetrics(MODEL, num_gpu_blocks=100, version=version).render(load(kv=0.25), TOTALS)
    names = set(_headers(text))
    assert present <= names
    assert not absent & names
    assert read_page(text, VLLM).kv_cache_usage == 0.25  # Pointsman's parser reads either name


@pytest.mark.parametrize(
    ("semantics", "running_label", "waiting_label"),
    [
        pytest.param("v0", "a", "b", id="v0-distinct-sets"),
        pytest.param("current", "a,b", "a,b", id="current-same-set"),
    ],
)
def test_lora_label_semantics(semantics: str, running_label: str, waiting_label: str) -> None:
    series = LoraInfoSeries(semantics)
    series.observe(2, ["a"], ["b"], 5.0)
    (sample,) = read_samples(series.render(), ["vllm:lora_requests_info"])["vllm:lora_requests_info"]
    assert (sample.labels["running_lora_adapters"], sample.labels["waiting_lora_adapters"]) == (
        running_label,
        waiting_label,
    )


def test_steps_feed_inter_token_latency_for_tokens_after_the_first() -> None:
    metrics = PodMetrics(MODEL, num_gpu_blocks=100)
    finished = FinishedRequest("r", 10, 2, arrived_at=0.0, first_token_at=0.02, finished_at=0.03)
    metrics.observe_step(StepResult(0.02, 0.01, {"r": 1, "s": 1}, (finished,), (), later_tokens=1))
    samples = read_samples(
        metrics.render(load(), TOTALS),
        [
            "vllm:inter_token_latency_seconds_count",
            "vllm:inter_token_latency_seconds_sum",
            "vllm:e2e_request_latency_seconds_count",
        ],
    )
    assert samples["vllm:inter_token_latency_seconds_count"][0].value == 1.0
    assert samples["vllm:inter_token_latency_seconds_sum"][0].value == pytest.approx(0.01)
    assert samples["vllm:e2e_request_latency_seconds_count"][0].value == 1.0


@pytest.mark.parametrize(
    ("version", "caching", "samples"),
    [
        pytest.param(
            "current",
            True,
            {"vllm:prefix_cache_queries_total": 200.0, "vllm:prefix_cache_hits_total": 48.0},
            id="v1-counters",
        ),
        pytest.param("v0", True, {"vllm:gpu_prefix_cache_hit_rate": 0.24}, id="v0-gauge"),
        pytest.param("v0", False, {"vllm:gpu_prefix_cache_hit_rate": -1.0}, id="v0-disabled"),
    ],
)
def test_prefix_cache_metrics_as_vllm_exports_them(
    version: str, caching: bool, samples: dict[str, float]
) -> None:
    totals = dataclasses.replace(TOTALS, prefix_cache_queries=200, prefix_cache_hits=48)
    text = PodMetrics(MODEL, num_gpu_blocks=100, version=version, prefix_caching=caching).render(
        load(), totals
    )
    read = read_samples(text, [*samples, "vllm:cache_config_info"])
    assert {name: read[name][0].value for name in samples} == samples
    (info,) = read["vllm:cache_config_info"]
    assert (info.labels["block_size"], info.labels["num_gpu_blocks"]) == ("16", "100")
    assert info.labels["enable_prefix_caching"] == str(caching)


def test_prefix_cache_help_lines_match_real_vllm() -> None:
    text = PodMetrics(MODEL, num_gpu_blocks=100).render(load(), TOTALS)
    assert (
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.\n"
        "# TYPE vllm:prefix_cache_queries_total counter\n"
    ) in text
    assert (
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.\n"
        in text
    )
