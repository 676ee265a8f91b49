"""Go encoding/json round trips of a map[string]interface{} (spec §1)."""

from __future__ import annotations

import json.encoder

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pointsman_picker import goencoding


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # keys sorted by bytes, no spaces, nested maps sorted too
        (b'{"b": 1, "a": {"y": [1, 2], "x": null}}', b'{"a":{"x":null,"y":[1,2]},"b":1}'),
        (b'{"\xc3\xa9": 1, "z": 2, "Z": 3}', b'{"Z":3,"z":2,"\xc3\xa9":1}'),
        # HTML characters and the JS line separators are escaped, other non-ASCII kept as UTF-8
        (b'{"p": "<a href=\\"x\\">&</a>"}', b'{"p":"\\u003ca href=\\"x\\"\\u003e\\u0026\\u003c/a\\u003e"}'),
        ('{"p": "\u2028\u2029 é 日本 😀"}'.encode(), '{"p":"\\u2028\\u2029 é 日本 😀"}'.encode()),
        (b'{"p": "\\u00e9\\ud83d\\ude00"}', '{"p":"é😀"}'.encode()),
        # control characters: short escapes where Go has them, \u00XX (lowercase hex) otherwise
        (b'{"p": "\\b\\f\\n\\r\\t\\u0001\\u001f\\u007f\\/"}', b'{"p":"\\b\\f\\n\\r\\t\\u0001\\u001f\x7f/"}'),
        # invalid UTF-8 in a string: one U+FFFD per bad byte; a lone surrogate escape: U+FFFD
        (b'{"p": "a\xffb\xe2\x82"}', '{"p":"a\ufffdb\ufffd\ufffd"}'.encode()),
        (b'{"p": "\\ud800x"}', '{"p":"\ufffdx"}'.encode()),
        (b'{"p": true, "q": false, "r": [], "s": {}}', b'{"p":true,"q":false,"r":[],"s":{}}'),
        # duplicate keys: the last wins
        (b'{"a": 1, "a": 2}', b'{"a":2}'),
    ],
)
def test_encode_like_go(raw, expected):
    assert goencoding.dumps(goencoding.loads(raw)) == expected


def test_a_lone_surrogate_escape_decodes_as_u_fffd_in_keys_values_and_lists():
    # Found by test_picker_body_properties: a passed-through model "\ud800" broke /metrics.
    raw = b'{"model": "\\ud800x", "\\udc00": ["\\uDBFF", "\\ud83d\\ude00"], "\\\\ud800": 1}'
    assert goencoding.loads(raw) == {
        "model": "\ufffdx",
        "\ufffd": ["\ufffd", "\U0001f600"],
        "\\ud800": 1.0,  # an escaped backslash, then "ud800": no surrogate
    }


@pytest.mark.parametrize(
    ("literal", "expected"),
    [
        ("0", "0"),
        ("-0", "-0"),
        ("0.0", "0"),
        ("1.0", "1"),
        ("100", "100"),
        ("1e3", "1000"),
        ("1.5E2", "150"),
        ("0.1", "0.1"),
        ("-2.50", "-2.5"),
        ("0.000001", "0.000001"),
        ("0.0000001", "1e-7"),
        ("1.5e-7", "1.5e-7"),
        ("1e-10", "1e-10"),
        ("123456789012345678", "123456789012345680"),
        ("12345678901234567890", "12345678901234567000"),
        ("1e20", "100000000000000000000"),
        ("1e21", "1e+21"),
        ("1.2345e300", "1.2345e+300"),
        ("5e-324", "5e-324"),
        ("0.30000000000000004", "0.30000000000000004"),
    ],
)
def test_numbers_like_go(literal, expected):
    assert goencoding.dumps(goencoding.loads(literal.encode())) == expected.encode()


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b'{"a":1}x',
        b"NaN",
        b'{"a": Infinity}',
        b"1e400",
        b"\xef\xbb\xbf{}",
        b"{'a':1}",
        b'{"a":01}',
        b"[" * 5000,
    ],
)
def test_loads_refuses_what_go_refuses(raw):
    with pytest.raises(ValueError, match=r"."):
        goencoding.loads(raw)


def go_string(text: str) -> bytes:
    """Go's string escaping written out: json's (quotes, backslash, \\b \\f \\n \\r \\t, other controls as
    \\u00xx, non-ASCII kept), then the HTML characters and U+2028, U+2029; a lone surrogate as U+FFFD."""
    escaped = json.encoder.py_encode_basestring(goencoding._SURROGATE.sub("\ufffd", text))
    for char in "<>&\u2028\u2029":
        escaped = escaped.replace(char, f"\\u{ord(char):04x}")
    return escaped.encode()


# every character class Go's escaping treats apart, surrogates included
TEXT = st.text(st.sampled_from('<>&"\\/\b\f\n\r\t\x00\x1f\x7f\u2028\u2029\ud800\udfffé€😀a')) | st.text()


@given(TEXT, TEXT)
def test_strings_are_escaped_as_go_escapes_them(key, value):
    assert goencoding.dumps(value) == go_string(value)
    assert goencoding.dumps({key: [value]}) == b"{" + go_string(key) + b":[" + go_string(value) + b"]}"
