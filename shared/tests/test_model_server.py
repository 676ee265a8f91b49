"""Every fixture page, read with its preset, against what its ``.expected.json`` says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pointsman_shared.model_server import PRESETS, LoraState, MetricsPageError, read_page

FIXTURES = Path(__file__).parent / "data" / "vllm-metrics"
PAGES = sorted(p.stem for p in FIXTURES.glob("*.txt"))


def _preset(name: str) -> str:
    return "sglang" if name.startswith("sglang") else "vllm"


def _load(name: str) -> tuple[str, dict[str, object]]:
    page = (FIXTURES / f"{name}.txt").read_text()
    expected = json.loads((FIXTURES / f"{name}.expected.json").read_text())
    return page, expected


def test_every_fixture_has_an_expectation() -> None:
    assert PAGES
    assert all((FIXTURES / f"{name}.expected.json").exists() for name in PAGES)


@pytest.mark.parametrize("name", PAGES)
def test_fixture_page(name: str) -> None:
    page, expected = _load(name)
    names = PRESETS[_preset(name)]
    if expected.get("error") == "parse":
        with pytest.raises(MetricsPageError) as excinfo:
            read_page(page, names)
        assert excinfo.value.reason == "parse"
        return
    got = read_page(page, names)
    # The prefix cache and the KV geometry, where the page tells them.
    counters = (got.prefix_cache.queries, got.prefix_cache.hits) if got.prefix_cache else None
    want = (
        (expected["prefix_cache_queries"], expected["prefix_cache_hits"])
        if "prefix_cache_queries" in expected
        else None
    )
    assert counters == want
    assert got.prefix_cache_hit_rate == expected.get("prefix_cache_hit_rate")
    assert (got.block_size, got.num_gpu_blocks) == (
        expected.get("block_size"),
        expected.get("num_gpu_blocks"),
    )
    if "error" in expected:
        # The LoRA series is unusable, the rest of the page still counts.
        assert got.lora_error == expected["error"]
        assert got.lora is None
        assert got.waiting is not None
        assert got.kv_cache_usage is not None
        return
    assert got.waiting == expected["waiting"]
    assert got.running == expected["running"]
    assert got.kv_cache_usage == pytest.approx(expected["kv_cache_usage"])
    if expected["active_adapters"] == "unchanged":
        assert got.lora is None
    elif expected["max_lora"] == 0 and expected["active_adapters"] == []:
        assert got.lora is None  # no LoRA family: nothing to say about adapters
    else:
        assert got.lora == LoraState(
            max_lora=expected["max_lora"],  # type: ignore[arg-type]
            running=frozenset(expected["running_adapters"]),  # type: ignore[arg-type]
            waiting=frozenset(expected["waiting_adapters"]),  # type: ignore[arg-type]
        )
        assert got.lora.running | got.lora.waiting == frozenset(expected["active_adapters"])  # type: ignore[arg-type]


LORA = "vllm:lora_requests_info"


def _lora(running: str, waiting: str, ts: float, max_lora: str = "4") -> str:
    labels = f'max_lora="{max_lora}",running_lora_adapters="{running}",waiting_lora_adapters="{waiting}"'
    return f"{LORA}{{{labels}}} {ts}\n"


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([_lora(" a , b ,", "", 2)], LoraState(4, frozenset({"a", "b"}), frozenset())),
        ([_lora("a", "", 2), _lora("b", "c", 3)], LoraState(4, frozenset({"b"}), frozenset({"c"}))),
        ([_lora("", "", 9), _lora("a", "", 1)], LoraState(4, frozenset({"a"}), frozenset())),
        ([_lora(" , ", "", 9)], None),
        ([], None),
    ],
    ids=["trimmed names", "newest wins", "idle newest skipped", "blank names are idle", "no family"],
)
def test_lora_series_rules(lines: list[str], expected: LoraState | None) -> None:
    page = "vllm:num_requests_waiting 1\n" + "".join(lines)
    assert read_page(page, PRESETS["vllm"]).lora == expected


@pytest.mark.parametrize(
    ("page", "reason"),
    [
        ("vllm:num_requests_waiting -1\n", "value"),
        ("vllm:num_requests_waiting NaN\n", "value"),
        ("vllm:kv_cache_usage_perc +Inf\n", "value"),
        ("vllm:num_requests_waiting{a=} 1\n", "parse"),
        # Found by test_model_server_properties: finite engines adding up to +Inf (OverflowError from
        # round()), and a count the codec cannot write as a 64-bit integer (every publish failed).
        (
            'vllm:num_requests_waiting{engine="0"} 1e308\nvllm:num_requests_waiting{engine="1"} 1e308\n',
            "value",
        ),
        ('vllm:kv_cache_usage_perc{engine="0"} 1e308\nvllm:kv_cache_usage_perc{engine="1"} 1e308\n', "value"),
        ("vllm:num_requests_running 1e19\n", "value"),
    ],
)
def test_unusable_values(page: str, reason: str) -> None:
    with pytest.raises(MetricsPageError) as excinfo:
        read_page(page, PRESETS["vllm"])
    assert excinfo.value.reason == reason


def test_a_max_lora_too_large_for_a_count_spoils_only_the_lora_series() -> None:
    page = "vllm:num_requests_waiting 1\n" + _lora("a", "", 1, max_lora="99999999999999999999")
    got = read_page(page, PRESETS["vllm"])
    assert (got.waiting, got.lora, got.lora_error) == (1, None, "max_lora")


def test_fields_a_page_omits_are_none() -> None:
    got = read_page("vllm:num_requests_running 2\n", PRESETS["vllm"])
    assert (got.waiting, got.running, got.kv_cache_usage, got.lora) == (None, 2, None, None)


@pytest.mark.parametrize(
    ("page", "kv"),
    [
        ("vllm:kv_cache_usage_perc 0.1\n", 0.1),
        ("vllm:gpu_cache_usage_perc 0.9\n", 0.9),
        ("vllm:gpu_cache_usage_perc 0.9\nvllm:kv_cache_usage_perc 0.1\n", 0.9),
        ("vllm:kv_cache_usage_perc 0.1\nvllm:gpu_cache_usage_perc 0.9\n", 0.1),
        (
            "# HELP vllm:kv_cache_usage_perc x\nvllm:cpu_cache_usage_perc 0.5\n"
            "vllm:gpu_cache_usage_perc 0.9\n",
            0.9,
        ),
        ("vllm:num_requests_waiting 1\n", None),
    ],
    ids=["new name", "old name", "old name first", "new name first", "comments and other names", "neither"],
)
def test_kv_is_read_under_either_name_whichever_comes_first(page: str, kv: float | None) -> None:
    assert read_page(page, PRESETS["vllm"]).kv_cache_usage == (None if kv is None else pytest.approx(kv))


@pytest.mark.parametrize(
    ("lines", "idle_max_lora"),
    [
        ([_lora("", "", 2, max_lora="3"), _lora("", "", 1, max_lora="9")], 3),
        ([_lora("a", "", 1, max_lora="2"), _lora("", "", 5, max_lora="3")], None),
        ([], None),
    ],
    ids=["newest idle series", "an active series wins", "no family"],
)
def test_idle_max_lora(lines: list[str], idle_max_lora: int | None) -> None:
    page = "vllm:num_requests_waiting 1\n" + "".join(lines)
    assert read_page(page, PRESETS["vllm"]).idle_max_lora == idle_max_lora


HEAD = '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine="0"} 1.0\n'


@pytest.mark.parametrize(
    ("lines", "counters", "rate", "geometry"),
    [
        pytest.param(
            'vllm:gpu_prefix_cache_queries_total{engine="0"} 10.0\n'
            'vllm:gpu_prefix_cache_hits_total{engine="0"} 4.0\n',
            (10.0, 4.0),
            None,
            (None, None),
            id="v1-0.8-names",
        ),
        pytest.param(
            'vllm:prefix_cache_queries_total{engine="0"} 10.0\n', None, None, (None, None), id="hits-missing"
        ),
        pytest.param(
            'vllm:gpu_prefix_cache_hit_rate{model_name="m"} -1.0\n', None, None, (None, None), id="v0-off"
        ),
        pytest.param(
            'vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.5\n', None, 0.5, (None, None), id="v0-on"
        ),
        pytest.param(
            'vllm:cache_config_info{block_size="32",num_gpu_blocks="x"} 1.0\n',
            None,
            None,
            (32, None),
            id="blocks-not-a-count",
        ),
        pytest.param(
            'vllm:cache_config_info{block_size="0"} 1.0\n', None, None, (None, None), id="no-block-size"
        ),
    ],
)
def test_prefix_cache_families(
    lines: str,
    counters: tuple[float, float] | None,
    rate: float | None,
    geometry: tuple[int | None, int | None],
) -> None:
    got = read_page(HEAD + lines, PRESETS["vllm"])
    assert ((got.prefix_cache.queries, got.prefix_cache.hits) if got.prefix_cache else None) == counters
    assert got.prefix_cache_hit_rate == rate
    assert (got.block_size, got.num_gpu_blocks) == geometry
    assert got.waiting == 1  # the rest of the page still counts
