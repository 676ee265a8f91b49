"""Properties of the exposition-format reader (``promparse.py``) on arbitrary pages: the real vLLM and SGLang
pages mutated, random bytes, huge numbers, NaN/Inf, bad label escapes, duplicate series. Each read gives
samples or :class:`PromParseError`, never another exception; what a well-formed line says is read back."""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import event, given
from hypothesis import strategies as st

from pointsman_shared.model_server import PRESETS
from pointsman_shared.promparse import PromParseError, Sample, read_family, read_first_family, read_samples

FIXTURES = Path(__file__).parent / "data" / "vllm-metrics"
PAGES = {p.stem: p.read_bytes() for p in sorted(FIXTURES.glob("*.txt"))}
WANTED = sorted({name for preset in PRESETS.values() for name in preset.families})
NAMES = st.sampled_from(WANTED) | st.sampled_from(
    ["m", "vllm:num_requests", "vllm:", "process_cpu_seconds_total"]
)

# Pieces that break the format where it is fragile: quotes, escapes, braces, odd numbers, bytes that are
# not UTF-8, and whole lines of a wanted metric.
PIECES = st.sampled_from(
    [
        b"{",
        b"}",
        b'"',
        b"\\",
        b'\\"',
        b"\\x",
        b",",
        b"=",
        b" ",
        b"\t",
        b"\n",
        b"\r\n",
        b"\x00",
        b"\xff",
        b"\xc3",
        b"NaN",
        b"+Inf",
        b"-Inf",
        b"1e999",
        b"-1",
        b"9" * 400,
        b"0x1p3",
        b"1_000",
        b"infinity",
        b'vllm:num_requests_waiting{engine="0"} 1\n',
        b'vllm:lora_requests_info{max_lora="x",running_lora_adapters="\\q"} 1\n',
        b"vllm:kv_cache_usage_perc 1.7976931348623157e308\n",
        b"\nvllm:num_requests_waiting",
    ]
)


@st.composite
def mutated_pages(draw: st.DrawFn) -> bytes:
    """A fixture page with a few edits, most of them on the lines of the metrics Pointsman reads."""
    page = bytearray(PAGES[draw(st.sampled_from(sorted(PAGES)))])
    for _ in range(draw(st.integers(1, 5))):
        name = draw(st.sampled_from(WANTED)).encode()
        near = page.find(b"\n" + name)
        at = draw(st.integers(0, len(page)))
        if near >= 0 and draw(st.integers(0, 3)):  # mostly somewhere on a wanted line
            at = min(len(page), near + 1 + draw(st.integers(0, 120)))
        op = draw(st.sampled_from(["insert", "replace", "delete", "truncate", "duplicate", "flip"]))
        if op == "insert":
            page[at:at] = draw(PIECES)
        elif op == "replace":
            page[at : at + draw(st.integers(1, 8))] = draw(PIECES)
        elif op == "delete":
            del page[at : at + draw(st.integers(1, 40))]
        elif op == "truncate":
            del page[at:]
        elif op == "duplicate":  # the line around ``at`` twice: a duplicate series
            start = page.rfind(b"\n", 0, at) + 1
            end = page.find(b"\n", at)
            line = page[start : (len(page) if end < 0 else end + 1)]
            page[start:start] = line if line.endswith(b"\n") else line + b"\n"
        elif at < len(page):
            page[at] ^= 1 << draw(st.integers(0, 7))
    return bytes(page)


ANY_PAGE = st.one_of(
    mutated_pages(),
    st.binary(max_size=200),
    st.lists(st.sampled_from(WANTED).map(str.encode) | PIECES, max_size=12).map(b"".join),
)


def check(samples: list[Sample]) -> None:
    for sample in samples:
        assert isinstance(sample.value, float)
        sample.label_text.encode("utf-8")  # checked UTF-8 when read
        labels = sample.labels
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())


@given(ANY_PAGE, st.lists(NAMES, max_size=3))
def test_any_page_gives_samples_or_a_parse_error(page: bytes, extra: list[str]) -> None:
    names = sorted({*WANTED, *extra})
    try:
        found = read_samples(page, names)
    except PromParseError:
        event("parse error")
        return
    event("read")
    assert set(found) == set(names)
    for samples in found.values():
        check(samples)
    # The same page as text reads the same (when it is text).
    try:
        text = page.decode("utf-8")
    except UnicodeDecodeError:
        return
    assert read_samples(text, names).keys() == found.keys()


@given(
    ANY_PAGE, st.sampled_from([p.kv_cache_usage for p in PRESETS.values()] + [("a", "b"), ("x_ab", "y_ab")])
)
def test_reading_the_first_of_several_names_gives_one_of_them_or_a_parse_error(
    page: bytes, metrics: tuple[str, ...]
) -> None:
    try:
        found = read_first_family(page, metrics)
    except PromParseError:
        return
    if found is None:
        for metric in metrics:
            assert read_family(page, metric) == []
        return
    name, samples = found
    assert name in metrics
    assert samples
    check(samples)
    assert samples == read_family(page, name)


# Well-formed lines, written as a server would; the reader must give back exactly what they say.
LABEL_NAMES = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True)
LABEL_VALUES = st.text(st.characters(codec="utf-8"), max_size=10)
VALUES = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1e308, 5e-324, 2.0**64])


def write_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@given(
    st.sampled_from(WANTED),
    st.lists(
        st.tuples(st.dictionaries(LABEL_NAMES, LABEL_VALUES, max_size=3), VALUES, st.booleans()),
        min_size=1,
        max_size=5,
    ),
    st.booleans(),
)
def test_well_formed_lines_are_read_back_exactly(
    name: str, series: list[tuple[dict[str, str], float, bool]], comments: bool
) -> None:
    lines = [f"# HELP {name} help\n# TYPE {name} gauge\n"] if comments else []
    for labels, value, timestamp in series:
        label_text = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
        braces = f"{{{label_text}}}" if labels else ""
        lines.append(f"{name}{braces} {write_value(value)}{' 1700000000000' if timestamp else ''}\n")
    page = f"other_metric 1\n{''.join(lines)}{name}_total 3\n".encode()
    samples = read_family(page, name)
    assert [s.labels for s in samples] == [labels for labels, _, _ in series]
    for sample, (_, value, _) in zip(samples, series, strict=True):
        assert sample.value == value or (math.isnan(sample.value) and math.isnan(value))
