from __future__ import annotations

import pytest

from pointsman_shared.promparse import (
    PromParseError,
    _seen_sample,
    read_family,
    read_first_family,
    read_last_family,
    read_samples,
)


@pytest.mark.parametrize(
    ("page", "name", "expected"),
    [
        ("m 1\n", "m", [({}, 1.0)]),
        ('m{a="x"} 2.5\n', "m", [({"a": "x"}, 2.5)]),
        ('m{a="x",b="y"} 3 1700000000000\n', "m", [({"a": "x", "b": "y"}, 3.0)]),
        ('m{a="x",} 4\n', "m", [({"a": "x"}, 4.0)]),
        ('m{a="q\\"uo\\\\te"} 5', "m", [({"a": 'q"uo\\te'}, 5.0)]),
        ('m{a="1,2"} 1.7640004e+09\n', "m", [({"a": "1,2"}, 1.7640004e9)]),
        ("m NaN\n", "m", [({}, float("nan"))]),
        ("# HELP m help\n# TYPE m gauge\nm_total 1\nm_created 2\nm 3\n", "m", [({}, 3.0)]),
        ("other 1\nxm 2\n", "m", []),
        ("m_total 1\n", "m", []),
        ("m_total 1\n# HELP m x\nm_created 2\n", "m", []),
        ("", "m", []),
        ('m{a="}{,"} 6\n', "m", [({"a": "}{,"}, 6.0)]),
        ('m{a="line\\nbreak"} 7\n', "m", [({"a": "line\nbreak"}, 7.0)]),
        ("m 8\r\n", "m", [({}, 8.0)]),
        ('m{ a = "x" , b="y" } 9\n', "m", [({"a": "x", "b": "y"}, 9.0)]),
        ('m{e="0"} 1\nm{e="1"} 2\nn 3\n', "m", [({"e": "0"}, 1.0), ({"e": "1"}, 2.0)]),
    ],
    ids=[
        "bare",
        "one label",
        "timestamp",
        "trailing comma",
        "escapes",
        "comma in value",
        "nan",
        "only exact name",
        "absent",
        "only a longer name, first",
        "only longer names and comments",
        "empty page",
        "braces in value",
        "escaped newline",
        "crlf",
        "spaces around labels",
        "one series per engine",
    ],
)
def test_read_samples(page: str, name: str, expected: list[tuple[dict[str, str], float]]) -> None:
    got = read_samples(page, [name])[name]
    assert len(got) == len(expected)
    for sample, (labels, value) in zip(got, expected, strict=True):
        assert sample.labels == labels
        assert (sample.value == value) or (sample.value != sample.value and value != value)


@pytest.mark.parametrize(
    "line",
    [
        'm{a="x" garbage,b="y"} 1',
        'm{a="x"',
        "m{a=x} 1",
        'm{a="x"} one',
        'm{a="x"}',
        'm{a="x"} 1 2 3',
        'm{-a="x"} 1',
        'm{a="x"}} 1',
        'm{a="x""} 1',
        'm{a="x" b="y"} 1',
        "m ",
    ],
)
def test_malformed_lines_raise(line: str) -> None:
    with pytest.raises(PromParseError, match="m"):
        read_samples(line + "\n", ["m"])


def test_a_family_ends_at_its_first_foreign_line() -> None:
    # The format keeps a metric's lines together; a stray line later on is not read (nor scanned for).
    page = "# TYPE m gauge\nm 1\n# TYPE n gauge\nn 2\nm 3\n"
    assert [s.value for s in read_family(page, "m")] == [1.0]


def test_labels_are_read_only_when_asked() -> None:
    (sample,) = read_family('m{a="x",b="y\\"z"} 1\n', "m")
    assert sample.label_text == 'a="x",b="y\\"z"'
    assert sample.labels == {"a": "x", "b": 'y"z'}


def test_bytes_and_text_read_alike() -> None:
    page = 'm{a="caf\u00e9"} 1\n'
    assert read_family(page.encode(), "m") == read_family(page, "m") == [('a="caf\u00e9"', 1.0)]


def test_labels_that_are_not_utf8_raise() -> None:
    with pytest.raises(PromParseError, match="not UTF-8"):
        read_family(b'm{a="\xff"} 1\n', "m")


# Lines seen before are not checked again (a cache by their text): a long line is not kept, and a
# malformed one never is, short or long, so it fails every page it is on.
LONG = "x" * 600


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        ('m{a="x"} 1\n', [('a="x"', 1.0)]),
        (f'm{{a="{LONG}"}} 1\n', [(f'a="{LONG}"', 1.0)]),
        ('m{a="x"} 1\nm{a="y"} 2\n', [('a="x"', 1.0), ('a="y"', 2.0)]),
    ],
)
def test_a_line_read_again_reads_the_same(page: str, expected: list[tuple[str, float]]) -> None:
    assert read_family(page, "m") == read_family(page, "m") == expected


def test_only_short_lines_are_kept() -> None:
    kept = _seen_sample.cache_info().currsize
    read_family(f'm{{a="{LONG}"}} 2\n', "m")
    assert _seen_sample.cache_info().currsize == kept
    read_family('m{a="only-here"} 2\n', "m")
    assert _seen_sample.cache_info().currsize == kept + 1


@pytest.mark.parametrize("line", ['m{a="x" garbage} 1', f'm{{a="{LONG}" garbage}} 1', b'm{a="\xff"} 1'])
def test_a_malformed_line_fails_every_time(line: str | bytes) -> None:
    for _ in range(2):
        with pytest.raises(PromParseError):
            read_family(line, "m")


@pytest.mark.parametrize(
    ("page", "names", "expected"),
    [
        ("a_x 1\nb_x 2\n", ("b_x", "a_x"), ("a_x", [1.0])),
        ("b_x 2\na_x 1\n", ("a_x", "b_x"), ("b_x", [2.0])),
        (
            '# HELP a_x h\nca_x 3\na_x_total 4\nb_x{e="0"} 5\nb_x{e="1"} 6\n',
            ("a_x", "b_x"),
            ("b_x", [5.0, 6.0]),
        ),
        ("a_x 1\n", ("bb_a_x", "a_x"), ("a_x", [1.0])),
        ("x_x 1\n", ("a_x", "b_x"), None),
        ("a 1\nb 2\n", ("b", "a"), ("a", [1.0])),
        ("b 2\n", ("a", "b"), ("b", [2.0])),
        ("b 2\n", ("b",), ("b", [2.0])),
        ("", ("a", "b"), None),
    ],
    ids=[
        "common ending, page order",
        "common ending, the later name first",
        "comments and longer names skipped",
        "a name longer than what precedes the hit",
        "none",
        "no common ending",
        "no common ending, only the later name",
        "one name",
        "empty page",
    ],
)
def test_read_first_family(
    page: str, names: tuple[str, ...], expected: tuple[str, list[float]] | None
) -> None:
    got = read_first_family(page, names)
    assert (got if got is None else (got[0], [s.value for s in got[1]])) == expected


@pytest.mark.parametrize(
    ("page", "values"),
    [
        pytest.param('a 1\ninfo{e="0"} 1\ninfo{e="1"} 2\n', [1.0, 2.0], id="at-the-end"),
        pytest.param('info{e="0"} 1\ninfo{e="1"} 2\nb 3\n', [1.0, 2.0], id="first-line"),
        pytest.param(
            "a 1\ninfo_total 5\ninfo 3\n# HELP info x\n", [3.0], id="not-a-longer-name-nor-a-comment"
        ),
        pytest.param("a 1\n", [], id="absent"),
    ],
)
def test_read_last_family_is_read_family_from_the_end(page: str, values: list[float]) -> None:
    assert [s.value for s in read_last_family(page, "info")] == values
    assert read_last_family(page, "info") == read_family(page, "info")
