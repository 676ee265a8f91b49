"""Properties of the scrape path on arbitrary pages (``scrape.py``, then ``normalize.py``): a page is a
:class:`PageError` whose reason the loop counts (one of ``SCRAPE_REASONS``, never ``internal``), or numbers
that make a pod snapshot every publish can write and every picker can read back."""

from __future__ import annotations

from pathlib import Path

from hypothesis import event, given
from hypothesis import strategies as st

from pointsman_collector.errors import SCRAPE_REASONS, PageError
from pointsman_collector.normalize import HealthPolicy, judge, new_pod, on_failure, on_page
from pointsman_collector.scrape import check_content_type, parse_page
from pointsman_shared.codec import decode_pool, encode_pool
from pointsman_shared.model_server import PRESETS, PageMetrics
from pointsman_shared.snapshot import PoolSnapshot

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "tests" / "data" / "vllm-metrics"
PAGES = {p.stem: p.read_bytes() for p in sorted(FIXTURES.glob("*.txt"))}
FAMILIES = sorted({name for preset in PRESETS.values() for name in preset.families})
NOW = 1_700_000_000.0

PIECES = st.sampled_from([b"{", b"}", b'"', b"\\", b"\n", b"\xff", b"NaN", b"-1", b"1e308", b"x", b""])
VALUES = st.one_of(
    st.sampled_from(["0", "3.0", "-1", "NaN", "+Inf", "1e300", "1e19", "9" * 25, "1.7976931348623157e308"]),
    st.floats().map(repr),
)


@st.composite
def pages(draw: st.DrawFn) -> tuple[bytes, str]:
    """A fixture page with its preset (mostly), edited on the lines the collector reads: bytes broken
    anywhere on them, or a value replaced by any number. Sometimes bytes that are no page at all."""
    name = draw(st.sampled_from(sorted(PAGES)))
    preset = "sglang" if name.startswith("sglang") else "vllm"
    if draw(st.integers(0, 9)) == 0:
        preset = draw(st.sampled_from(sorted(PRESETS)))
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=120)), preset
    page = bytearray(PAGES[name])
    for _ in range(draw(st.integers(0, 4))):
        start = page.find(b"\n" + draw(st.sampled_from(PRESETS[preset].families)).encode()) + 1
        if start == 0:
            continue
        end = page.find(b"\n", start)
        end = len(page) if end < 0 else end
        if draw(st.booleans()):
            at = draw(st.integers(start, end))
            page[at : at + draw(st.integers(0, 6))] = draw(PIECES)
        else:
            space = page.rfind(b" ", start, end)
            page[space + 1 : end] = draw(VALUES).encode()
    return bytes(page), preset


def scrape(body: bytes, preset: str) -> PageMetrics | str:
    """The page's numbers, or the reason the loop counts for it."""
    try:
        return parse_page(body, PRESETS[preset])
    except PageError as exc:
        return exc.reason


@given(pages())
def test_a_page_is_a_counted_reason_or_a_snapshot_every_reader_can_read(page: tuple[bytes, str]) -> None:
    got = scrape(*page)
    if isinstance(got, str):
        event(f"reason {got}")
        assert got in SCRAPE_REASONS
        assert got != "internal"
        return
    event("good" if got.lora_error is None else f"good, lora {got.lora_error}")
    if got.lora_error is not None:
        assert got.lora_error in SCRAPE_REASONS  # counted too
    state = on_page(new_pod("10.0.0.1:8000"), got, NOW)
    snap = state.snapshot
    assert snap.healthy
    pool = PoolSnapshot(pool="p", version=1, published_at=NOW, pods=(snap,))
    assert decode_pool(encode_pool(pool), 1) == pool  # one bad pod must not stop the pool's publishes


@given(st.lists(pages(), min_size=1, max_size=6), st.integers(1, 4))
def test_a_run_of_scrapes_keeps_the_last_good_numbers_and_follows_the_health_policy(
    bodies: list[tuple[bytes, str]], max_failures: int
) -> None:
    policy = HealthPolicy(max_failures=max_failures, staleness=60.0)
    state = new_pod("10.0.0.1:8000")
    good: PageMetrics | None = None
    failures = 0
    for i, page in enumerate(bodies):
        got = scrape(*page)
        now = NOW + i
        if isinstance(got, str):
            failures += 1
            before = state.snapshot
            state = on_failure(state, got, now, policy)
            # The data stays as last known; only health and reason move.
            assert (state.snapshot.waiting, state.snapshot.updated_at) == (before.waiting, before.updated_at)
        else:
            failures = 0
            good = got
            state = on_page(state, got, now)
        state = judge(state, now, policy)
        snap = state.snapshot
        assert snap.healthy == (good is not None and failures < max_failures)
        assert snap.healthy == (snap.reason == "")
        if good is not None and good.waiting is not None and failures == 0:
            assert snap.waiting == good.waiting


@given(
    st.binary(max_size=60) | st.sampled_from([b"text/plain; version=0.0.4", b"TEXT/HTML", b" text/plain ;x"])
)
def test_any_content_type_passes_or_is_counted_as_content_type(content_type: bytes) -> None:
    try:
        check_content_type(content_type)
    except PageError as exc:
        error = exc
    else:
        return
    assert error.reason == "content_type"
    assert error.detail  # it renders, whatever the bytes were
