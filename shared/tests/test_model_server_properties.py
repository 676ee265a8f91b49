"""Properties of ``model_server.read_page`` on arbitrary pages (mutated fixture pages, random bytes, pages
written from arbitrary numbers and labels): :class:`MetricsPageError` with a bounded reason, or numbers a
snapshot can carry (counts that fit the codec's 64-bit integers, finite non-negative KV use), never another
exception."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from pointsman_shared.model_server import PRESETS, MetricNames, MetricsPageError, PageMetrics, read_page

FIXTURES = Path(__file__).parent / "data" / "vllm-metrics"
PAGES = {p.stem: p.read_bytes() for p in sorted(FIXTURES.glob("*.txt"))}
VLLM = PRESETS["vllm"]
READ_REASONS = {"parse", "value"}
MAX_INT64 = 2**63 - 1  # what the snapshot codec can write

PIECES = st.sampled_from(
    [b"{", b"}", b'"', b"\\", b",", b"\n", b"\xff", b"NaN", b"+Inf", b"-1", b"1e308", b"9" * 30, b"1_0", b""]
)


@st.composite
def mutated_pages(draw: st.DrawFn) -> bytes:
    """A fixture page with edits on the lines of the families read."""
    page = bytearray(PAGES[draw(st.sampled_from(sorted(PAGES)))])
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.sampled_from([*VLLM.families, *PRESETS["sglang"].families])).encode()
        line = page.find(b"\n" + name)
        at = (
            min(len(page), line + 1 + draw(st.integers(0, 150)))
            if line >= 0
            else draw(st.integers(0, len(page)))
        )
        page[at : at + draw(st.integers(0, 6))] = draw(PIECES)
    return bytes(page)


# Pages written from scratch: any number in any family, LoRA series with any labels, series repeated.
NUMBERS = st.one_of(
    st.sampled_from(
        ["0", "1", "7.0", "-1", "NaN", "+Inf", "-Inf", "1e308", "1.7976931348623157e308", "1e19"]
    ),
    st.sampled_from(["9223372036854775807", "18446744073709551616", "0.5", "2.5", "1e-300", "-0"]),
    st.floats(allow_nan=True).map(repr),
)
LABEL_TEXT = st.text(st.sampled_from('ab, -_1"\\n\xe9'), max_size=10)


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


@st.composite
def written_pages(draw: st.DrawFn) -> bytes:
    lines = []
    for family in draw(st.lists(st.sampled_from(VLLM.families), max_size=6)):
        for _ in range(draw(st.integers(1, 3))):
            if family == VLLM.lora_info:
                labels = {
                    "max_lora": draw(
                        st.sampled_from(["0", "2", "-1", "x", "", " 3", "99999999999999999999"]) | LABEL_TEXT
                    ),
                    "running_lora_adapters": draw(st.sampled_from(["", "a", "a,b", " , "]) | LABEL_TEXT),
                    "waiting_lora_adapters": draw(st.sampled_from(["", "c"]) | LABEL_TEXT),
                }
                label_text = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
                lines.append(f"{family}{{{label_text}}} {draw(NUMBERS)}\n")
            else:
                engine = draw(st.integers(0, 3))
                lines.append(f'{family}{{engine="{engine}"}} {draw(NUMBERS)}\n')
    return "".join(lines).encode()


ANY_PAGE = st.one_of(mutated_pages(), written_pages(), st.binary(max_size=200))


def read(page: bytes, names: MetricNames) -> PageMetrics | None:
    try:
        got = read_page(page, names)
    except MetricsPageError as exc:
        reason = exc.reason
    else:
        event("read" if got.lora_error is None else f"read, lora: {got.lora_error}")
        return got
    assert reason in READ_REASONS
    event(f"refused: {reason}")
    return None


def check_usable(got: PageMetrics) -> None:
    """What a snapshot can hold and the codec can write."""
    for count in (got.waiting, got.running):
        assert count is None or (isinstance(count, int) and 0 <= count <= MAX_INT64)
    kv = got.kv_cache_usage
    assert kv is None or (math.isfinite(kv) and kv >= 0)
    assert got.lora_error in (None, "max_lora")
    if got.lora is not None:
        assert 0 <= got.lora.max_lora <= MAX_INT64
        assert got.lora.running or got.lora.waiting
        assert all(
            name and name == name.strip() and "," not in name for name in got.lora.running | got.lora.waiting
        )
    assert got.idle_max_lora is None or 0 <= got.idle_max_lora <= MAX_INT64


@given(ANY_PAGE, st.sampled_from(sorted(PRESETS)))
def test_any_page_is_refused_with_a_reason_or_gives_usable_numbers(page: bytes, preset: str) -> None:
    got = read(page, PRESETS[preset])
    if got is not None:
        check_usable(got)


@given(written_pages())
def test_counts_are_the_sum_of_the_engines_when_every_value_is_a_count(page: bytes) -> None:
    got = read(page, VLLM)
    if got is None:
        return
    check_usable(got)
    lines = page.splitlines()
    for field, family in (("waiting", VLLM.waiting), ("running", VLLM.running)):
        # The family's lines are together on a page: its first run of lines is read, any later is not.
        ours = [line.startswith(family.encode() + b"{") for line in lines]
        start = ours.index(True) if True in ours else len(lines)
        run = itertools.takewhile(bool, ours[start:])
        values = [float(lines[start + i].rsplit(b" ", 1)[1]) for i, _ in enumerate(run)]
        assert getattr(got, field) == (round(sum(values)) if values else None)


@given(
    st.lists(st.sampled_from(["1e308", "1.7976931348623157e308", "9e307"]), min_size=2, max_size=4),
    st.sampled_from(VLLM.families[:3]),
)
def test_engines_whose_sum_overflows_are_refused_as_a_bad_value(values: list[str], family: str) -> None:
    page = "".join(f'{family}{{engine="{i}"}} {v}\n' for i, v in enumerate(values)).encode()
    with pytest.raises(MetricsPageError) as caught:
        read_page(page, VLLM)
    assert caught.value.reason == "value"
