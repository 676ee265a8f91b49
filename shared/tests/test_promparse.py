from __future__ import annotations

import pytest

from pointsman_shared.promparse import PromParseError, Sample, read_samples


@pytest.mark.parametrize(
    ("page", "name", "expected"),
    [
        ("m 1\n", "m", [Sample({}, 1.0)]),
        ('m{a="x"} 2.5\n', "m", [Sample({"a": "x"}, 2.5)]),
        ('m{a="x",b="y"} 3 1700000000000\n', "m", [Sample({"a": "x", "b": "y"}, 3.0)]),
        ('m{a="x",} 4\n', "m", [Sample({"a": "x"}, 4.0)]),
        ('m{a="q\\"uo\\\\te"} 5', "m", [Sample({"a": 'q"uo\\te'}, 5.0)]),
        ('m{a="1,2"} 1.7640004e+09\n', "m", [Sample({"a": "1,2"}, 1.7640004e9)]),
        ("m NaN\n", "m", [Sample({}, float("nan"))]),
        ("# HELP m help\n# TYPE m gauge\nm_total 1\nm_created 2\nm 3\n", "m", [Sample({}, 3.0)]),
        ("other 1\nxm 2\n", "m", []),
        ("", "m", []),
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
        "empty page",
    ],
)
def test_read_samples(page: str, name: str, expected: list[Sample]) -> None:
    got = read_samples(page, [name])[name]
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.labels == e.labels
        assert (g.value == e.value) or (g.value != g.value and e.value != e.value)


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
    ],
)
def test_malformed_lines_raise(line: str) -> None:
    with pytest.raises(PromParseError, match="m"):
        read_samples(line + "\n", ["m"])
