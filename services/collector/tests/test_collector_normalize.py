"""Every fixture page, read and merged, against its ``.expected.json``; then the health rules."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pointsman_collector.errors import PageError
from pointsman_collector.normalize import (
    PENDING,
    STALE,
    HealthPolicy,
    PodState,
    judge,
    new_pod,
    on_failure,
    on_page,
    same_load,
)
from pointsman_collector.scrape import parse_page
from pointsman_shared.model_server import PRESETS, LoraState, PageMetrics, PrefixCounters
from pointsman_shared.snapshot import FieldTimes, PodSnapshot
from pointsman_testkit import every_field_set, pod

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "tests" / "data" / "vllm-metrics"
PAGES = sorted(p.stem for p in FIXTURES.glob("*.txt"))
POLICY = HealthPolicy(max_failures=3, staleness=2.0)
NOW = 1_764_000_100.0
LORA_FIELDS = ("max_lora", "running_adapters", "waiting_adapters", "active_adapters")
# Pages without the LoRA family: their expectations state a never-LoRA pod's defaults.
NO_LORA_FAMILY = {"vllm-no-lora", "sglang"}


def page(
    waiting: int | None = None,
    running: int | None = None,
    kv: float | None = None,
    lora: LoraState | None = None,
    lora_error: str | None = None,
) -> PageMetrics:
    return PageMetrics(waiting=waiting, running=running, kv_cache_usage=kv, lora=lora, lora_error=lora_error)


def scraped(snapshot: PodSnapshot) -> PodState:
    """A pod whose last good scrape gave ``snapshot``."""
    return PodState(snapshot, good=True)


# What a pod looked like before the fixture page: every field set, so "unchanged" is observable.
LOADED = scraped(
    pod(
        waiting=40,
        running=41,
        kv=0.99,
        max_lora=8,
        adapters=frozenset({"old-run"}),
        waiting_adapters=frozenset({"old-wait"}),
        updated_at=NOW - 0.05,
        field_times=FieldTimes(NOW - 0.05, NOW - 0.1, NOW - 0.2, NOW - 0.3),
    )
)
FRESH = new_pod("10.0.0.1:8000")


def scrape(state: PodState, name: str) -> tuple[PodState, str | None]:
    """Read a fixture page the way the pod loop does; return the new state and the error counted."""
    names = PRESETS["sglang" if name.startswith("sglang") else "vllm"]
    try:
        metrics = parse_page((FIXTURES / f"{name}.txt").read_bytes(), names)
    except PageError as exc:
        return on_failure(state, exc.reason, NOW, POLICY), exc.reason
    return on_page(state, metrics, NOW), metrics.lora_error


def value(snapshot: PodSnapshot, name: str) -> object:
    got = getattr(snapshot, name)
    return sorted(got) if isinstance(got, frozenset) else got


def lora(snapshot: PodSnapshot) -> list[object]:
    return [value(snapshot, field) for field in LORA_FIELDS]


def data(snapshot: PodSnapshot) -> list[object]:
    """Everything a scrape reports, i.e. all but health."""
    return [value(snapshot, f) for f in ("waiting", "running", "kv_cache_usage", "updated_at", *LORA_FIELDS)]


@pytest.mark.parametrize("name", PAGES)
@pytest.mark.parametrize("before", [FRESH, LOADED], ids=["fresh pod", "loaded pod"])
def test_fixture_page(name: str, before: PodState) -> None:
    expected = json.loads((FIXTURES / f"{name}.expected.json").read_text())
    after, error = scrape(before, name)
    if "error" in expected:
        assert error == expected["error"]
        if error == "max_lora":
            # The LoRA series was unusable: LoRA fields stand, queue and KV update, the pod stays healthy.
            assert (after.good, after.snapshot.healthy) == (True, True)
            assert (after.snapshot.waiting, after.snapshot.kv_cache_usage) == (1, pytest.approx(0.1))
            assert lora(after.snapshot) == lora(before.snapshot)
        else:
            assert data(after.snapshot) == data(before.snapshot)
            assert after.failures == before.failures + 1
        return
    assert error is None
    assert (after.snapshot.healthy, after.snapshot.reason, after.snapshot.updated_at) == (True, "", NOW)
    for field in ("waiting", "running", "kv_cache_usage", *LORA_FIELDS):
        want = expected[field]
        if want == "unchanged" or (field in LORA_FIELDS and name in NO_LORA_FAMILY):
            # The last-known adapter set rule: a page that names no adapters keeps the previous ones (for
            # a fresh pod those are the empty defaults the expectation states).
            want = value(before.snapshot, field)
            if field == "max_lora" and before.snapshot.max_lora == 0 and name in IDLE_MAX_LORA:
                # Our one departure: a pod with no known max_lora takes the idle series' value.
                want = IDLE_MAX_LORA[name]
        got = value(after.snapshot, field)
        assert got == (pytest.approx(want) if field == "kv_cache_usage" else want), field


# The max_lora label of the idle series on the pages whose every LoRA series is idle.
IDLE_MAX_LORA = {"vllm-idle-all-empty": 4}


@pytest.mark.parametrize(
    ("previous", "page", "expected"),
    [
        (0, PageMetrics(None, None, None, None, idle_max_lora=4), 4),
        (2, PageMetrics(None, None, None, None, idle_max_lora=4), 2),
        (0, PageMetrics(None, None, None, None), 0),
        (0, PageMetrics(None, None, None, LoraState(3, frozenset({"a"}), frozenset())), 3),
    ],
    ids=["unknown takes idle", "known stands", "no family", "active series wins"],
)
def test_max_lora_from_an_idle_series_only_while_unknown(
    previous: int, page: PageMetrics, expected: int
) -> None:
    before = PodState(PodSnapshot("10.0.0.1:8000", max_lora=previous), good=True)
    assert on_page(before, page, NOW).snapshot.max_lora == expected


def test_every_fixture_page_is_covered() -> None:
    assert len(PAGES) >= 9
    assert all((FIXTURES / f"{name}.expected.json").exists() for name in PAGES)


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        (page(waiting=1), pod(waiting=1, running=41, kv=0.99)),
        (page(running=2, kv=0.5), pod(waiting=40, running=2, kv=0.5)),
        (page(waiting=0, running=0, kv=0.0), pod(waiting=0, running=0, kv=0.0)),
    ],
    ids=["only waiting", "no waiting", "zeros are values"],
)
def test_fields_the_page_omits_keep_their_values(metrics: PageMetrics, expected: PodSnapshot) -> None:
    after = on_page(LOADED, metrics, NOW).snapshot
    assert (after.waiting, after.running, after.kv_cache_usage) == (
        expected.waiting,
        expected.running,
        expected.kv_cache_usage,
    )


THEN = LOADED.snapshot.field_times


@pytest.mark.parametrize(
    ("metrics", "times"),
    [
        (page(waiting=1, running=2, kv=0.5, lora=LoraState(2, frozenset({"a"}), frozenset())), (NOW,) * 4),
        (page(waiting=1, running=2, kv=0.5), (NOW, NOW, NOW, THEN.lora)),
        (PageMetrics(None, None, 0.5, None, idle_max_lora=4), (THEN.waiting, THEN.running, NOW, NOW)),
        (page(waiting=1, lora_error="max_lora"), (NOW, THEN.running, THEN.kv_cache_usage, THEN.lora)),
    ],
    ids=["every family", "no lora family", "only kv and an idle lora series", "unusable lora series"],
)
def test_each_field_keeps_the_time_it_was_last_read(
    metrics: PageMetrics, times: tuple[float, float, float, float]
) -> None:
    after = on_page(LOADED, metrics, NOW).snapshot
    assert after.field_times == FieldTimes(*times)
    assert after.updated_at == NOW


@pytest.mark.parametrize(
    ("metrics", "adapters"),
    [
        (page(waiting=1), ({"old-run"}, {"old-wait"}, 8)),
        (page(waiting=1, lora_error="max_lora"), ({"old-run"}, {"old-wait"}, 8)),
        (page(waiting=1, lora=LoraState(2, frozenset({"a"}), frozenset())), ({"a"}, set(), 2)),
        (page(waiting=1, lora=LoraState(0, frozenset(), frozenset({"b"}))), (set(), {"b"}, 0)),
    ],
    ids=["no lora: last known", "lora error: last known", "new set replaces", "max_lora 0 is a value"],
)
def test_adapter_sets(metrics: PageMetrics, adapters: tuple[set[str], set[str], int]) -> None:
    after = on_page(LOADED, metrics, NOW).snapshot
    assert (after.running_adapters, after.waiting_adapters, after.max_lora) == adapters


def test_a_page_without_numbers_carries_every_field_over() -> None:
    # Made from the field list: a field added to PodSnapshot that on_page does not carry over fails here.
    before = scraped(every_field_set())
    after = on_page(before, PageMetrics(None, None, None, None), NOW).snapshot
    want = replace(before.snapshot, updated_at=NOW, healthy=True, reason="")
    assert [getattr(after, slot) for slot in PodSnapshot.__slots__] == [
        getattr(want, slot) for slot in PodSnapshot.__slots__
    ]


# Health: (scrape outcomes in order, seconds after the last one when judged, healthy, reason).
# "ok" is a good scrape at t=0; a reason is a failed scrape at t=0.
@pytest.mark.parametrize(
    ("outcomes", "later", "healthy", "reason"),
    [
        ([], 0.0, False, PENDING),
        (["connect"], 0.0, False, "connect"),
        (["ok"], 0.0, True, ""),
        (["ok", "http_status"], 0.0, True, ""),
        (["ok", "http_status", "parse"], 0.0, True, ""),
        (["ok", "http_status", "parse", "http_status"], 0.0, False, "http_status"),
        (["ok", "connect", "connect", "connect", "ok"], 0.0, True, ""),
        (["ok", "parse", "ok", "parse", "ok", "parse"], 0.0, True, ""),
        (["ok"], 2.0, True, ""),
        (["ok"], 2.01, False, STALE),
        (["ok", "connect"], 2.01, False, "connect"),
        (["ok", "connect", "connect", "connect"], 5.0, False, "connect"),
        (["ok", "timeout"], 0.0, False, "timeout"),
        (["ok", "timeout", "ok"], 0.0, True, ""),
    ],
    ids=[
        "not scraped yet",
        "first scrape failed",
        "good",
        "one failure",
        "two failures",
        "three failures in a row",
        "recovers on the next good scrape",
        "failures not in a row",
        "at the staleness limit",
        "past the staleness limit",
        "stale while failing",
        "failing and stale",
        "a timeout is unhealthy at once",
        "and heals on the next good scrape",
    ],
)
def test_health(outcomes: list[str], later: float, healthy: bool, reason: str) -> None:
    state = FRESH
    for outcome in outcomes:
        if outcome == "ok":
            state = on_page(state, page(waiting=1), NOW)
        else:
            state = on_failure(state, outcome, NOW, POLICY)
    state = judge(state, NOW + later, POLICY)
    assert (state.snapshot.healthy, state.snapshot.reason) == (healthy, reason)


def test_failures_keep_the_last_good_data_and_time() -> None:
    state = LOADED
    for _ in range(5):
        state = on_failure(state, "timeout", NOW, POLICY)
    assert data(state.snapshot) == data(LOADED.snapshot)
    assert state.failures == 5


def test_judge_returns_the_same_state_when_nothing_changes() -> None:
    state = on_page(FRESH, page(waiting=1), NOW)
    assert judge(state, NOW + 1, POLICY) is state


@pytest.mark.parametrize(
    ("change", "same"),
    [
        ({"updated_at": NOW + 1}, True),
        ({"waiting": 1}, False),
        ({"kv": 0.5}, False),
        ({"adapters": frozenset({"x"})}, False),
        ({"healthy": False, "reason": "timeout"}, False),
    ],
)
def test_same_load_ignores_only_the_update_time(change: dict[str, object], same: bool) -> None:
    assert same_load(pod(updated_at=NOW), pod(**{"updated_at": NOW, **change})) is same


def test_normalize_is_pure() -> None:
    """The fence: no I/O clients, web framework or metrics library behind the merge and health rules."""
    code = (
        "import sys, pointsman_collector.normalize\n"
        "banned = {'redis', 'httpx', 'fastapi', 'starlette', 'uvicorn', 'prometheus_client', 'asyncio'}\n"
        "print(sorted(banned & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def prefix_page(queries: float, hits: float) -> PageMetrics:
    return replace(page(waiting=1), prefix_cache=PrefixCounters(queries, hits))


def scrapes(readings: list[tuple[float, float, float]], window: float = 30.0) -> list[float | None]:
    """The hit rate published after each scrape of ``(seconds in, queries, hits)``."""
    state, rates = FRESH, []
    for at, queries, hits in readings:
        state = on_page(state, prefix_page(queries, hits), NOW + at, window)
        rates.append(state.snapshot.prefix_cache_hit_rate)
    return rates


@pytest.mark.parametrize(
    ("readings", "rates"),
    [
        pytest.param([(0, 0, 0)], [0.0], id="exports-no-query-yet"),
        pytest.param([(0, 1000, 500)], [0.5], id="first-reading-since-start"),
        pytest.param([(0, 1000, 500), (1, 2000, 1400)], [0.5, 0.9], id="over-the-window-not-since-start"),
        pytest.param([(0, 1000, 500), (1, 1000, 500)], [0.5, 0.5], id="no-query-keeps-the-rate"),
        pytest.param([(0, 5000, 100), (1, 100, 100)], [0.02, 0.02], id="reset-starts-again"),
        pytest.param(
            # Readings kept 3 s apart; at 40 s the window starts at the reading of 12 s (or later).
            [(0, 0, 0), *((float(t), 100.0 * t, 0.0) for t in range(1, 31)), (40, 4000, 1000)],
            [*([0.0] * 31), 1000 / (4000 - 1200)],
            id="old-readings-leave-the-window",
        ),
    ],
)
def test_the_prefix_hit_rate_is_over_the_window(
    readings: list[tuple[float, float, float]], rates: list[float]
) -> None:
    assert scrapes(readings) == [pytest.approx(r) for r in rates]


def test_a_v0_gauge_and_the_cache_config_carry_into_the_snapshot() -> None:
    v0 = replace(page(waiting=1), prefix_cache_hit_rate=0.25, block_size=16, num_gpu_blocks=27386)
    after = on_page(FRESH, v0, NOW)
    snapshot = after.snapshot
    assert (snapshot.prefix_cache_hit_rate, snapshot.block_size, snapshot.num_gpu_blocks) == (0.25, 16, 27386)
    # A page without them keeps them; a failed scrape keeps the readings too.
    again = on_page(after, page(waiting=2), NOW + 1)
    assert (again.snapshot.prefix_cache_hit_rate, again.snapshot.block_size) == (0.25, 16)
    counted = on_page(FRESH, prefix_page(100, 50), NOW)
    assert on_failure(counted, "timeout", NOW + 1, POLICY).readings == counted.readings
