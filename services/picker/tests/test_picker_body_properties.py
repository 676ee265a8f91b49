"""Properties of the body reader (``body.py``) and Go's JSON rules (``goencoding.py``) on arbitrary input:
a :class:`BadRequest` or a result, never another exception; a rewrite of ``model`` keeps every other field."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pointsman_picker import goencoding
from pointsman_picker.body import RequestBody, parse_body, with_model
from pointsman_picker.errors import BadRequest

# Text as JSON can carry it: any code point, lone surrogates included (written as \\ud800 escapes).
TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=12) | st.sampled_from(
    ["", "model", "<&>", "\u2028\u2029", "\ud800", "a\udc00b", "\ud83d\ude00", "\x00\x1f\x7f", "é😀"]
)
NUMBERS = (
    st.floats(allow_nan=False, allow_infinity=False)
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0.0, -0.0, 1e21, 1e-7, 5e-324, 1.7976931348623157e308, 2**53 + 1])
)
SCALARS = st.none() | st.booleans() | NUMBERS | TEXT
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)


def encode(value: Any, *, ascii_only: bool, spaced: bool) -> bytes:
    """A client's JSON for ``value``: ASCII-escaped or raw UTF-8 (lone surrogates escaped), compact or not."""
    separators = (", ", ": ") if spaced else (",", ":")
    text = json.dumps(value, ensure_ascii=ascii_only, separators=separators, allow_nan=False)
    return text.encode("utf-8", "backslashreplace") if ascii_only else _escape_surrogates(text)


def _escape_surrogates(text: str) -> bytes:
    return "".join(f"\\u{ord(c):04x}" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text).encode()


def outcome(raw: bytes) -> RequestBody | BadRequest:
    try:
        return parse_body(raw)
    except BadRequest as exc:
        return exc


def no_surrogates(value: Any) -> bool:
    if isinstance(value, str):
        return not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, dict):
        return all(no_surrogates(k) and no_surrogates(v) for k, v in value.items())
    if isinstance(value, list):
        return all(no_surrogates(v) for v in value)
    return True


@given(st.binary(max_size=300))
def test_any_bytes_are_a_body_or_a_bad_request(raw: bytes) -> None:
    got = outcome(raw)
    if isinstance(got, RequestBody):
        assert isinstance(got.model, str)
        assert got.raw is raw


# Bodies that are almost JSON: a valid body with bytes cut, inserted or replaced.
BODY = st.builds(
    lambda doc, ascii_only: encode(doc, ascii_only=ascii_only, spaced=False),
    st.fixed_dictionaries({"model": TEXT}, optional={"prompt": JSON_VALUES, "n": NUMBERS}),
    st.booleans(),
)


@st.composite
def mutated_bodies(draw: st.DrawFn) -> bytes:
    raw = bytearray(draw(BODY))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(raw)))
        op = draw(st.sampled_from(["cut", "insert", "replace", "truncate"]))
        piece = draw(st.sampled_from([b"{", b"}", b"[", b'"', b"\\", b",", b":", b"\xff", b"\xc3", b"1e999"]))
        if op == "cut":
            del raw[at : at + draw(st.integers(1, 3))]
        elif op == "insert":
            raw[at:at] = piece
        elif op == "replace" and at < len(raw):
            raw[at : at + 1] = piece
        else:
            del raw[at:]
    return bytes(raw)


@given(mutated_bodies())
def test_almost_json_is_a_body_or_a_bad_request(raw: bytes) -> None:
    got = outcome(raw)
    if isinstance(got, RequestBody):
        assert isinstance(got.model, str)


@given(st.sampled_from(["[", "{", '{"a":', '{"model":"m","x":[']), st.integers(1, 20_000))
def test_deep_nesting_is_a_bad_request_or_a_body(opening: str, depth: int) -> None:
    raw = (opening * depth).encode()
    assert isinstance(outcome(raw), BadRequest)  # never closed
    closing = {"[": "]", "{": "}", '{"a":': "}", '{"model":"m","x":[': "]}"}[opening]
    closed = (opening * depth + ("0" if opening.endswith(":") else "") + closing * depth).encode()
    got = outcome(closed)
    if isinstance(got, RequestBody):  # shallow enough for the stack: the rewrite works too
        with_model(got, "other")


@given(JSON_VALUES, st.booleans(), st.booleans())
def test_a_document_that_is_not_an_object_with_a_string_model_is_a_bad_request(
    doc: Any, ascii_only: bool, spaced: bool
) -> None:
    got = outcome(encode(doc, ascii_only=ascii_only, spaced=spaced))
    routable = (isinstance(doc, dict) and isinstance(doc.get("model"), str)) or doc is None
    if doc is None or not routable:
        assert isinstance(got, BadRequest)
    else:
        assert isinstance(got, RequestBody)


@given(
    st.dictionaries(TEXT, JSON_VALUES, max_size=6),
    TEXT,
    TEXT,
    st.booleans(),
    st.booleans(),
)
def test_the_rewrite_changes_model_and_keeps_every_other_field(
    doc: dict[str, Any], model: str, target: str, ascii_only: bool, spaced: bool
) -> None:
    raw = encode({**doc, "model": model}, ascii_only=ascii_only, spaced=spaced)
    body = parse_body(raw)
    decoded = goencoding.loads(raw)
    # Go's decoder: a lone surrogate escape is U+FFFD, so what the picker reads is valid UTF-8 text.
    assert no_surrogates(decoded)
    assert body.model == decoded["model"]
    out = with_model(body, target)
    if target == body.model:
        assert out is raw
        return
    assert goencoding.loads(out) == {**decoded, "model": goencoding.loads(goencoding.dumps(target))}
    assert out == goencoding.dumps(goencoding.loads(out))  # Go's encoding is a fixed point
    out.decode("utf-8")  # Envoy forwards it as it is: valid UTF-8


@given(st.binary(max_size=200) | BODY)
def test_loads_raises_only_value_error_and_what_it_returns_encodes(raw: bytes) -> None:
    try:
        value = goencoding.loads(raw)
    except ValueError:
        return
    assert no_surrogates(value)
    encoded = goencoding.dumps(value)
    assert goencoding.loads(encoded) == value


@given(NUMBERS)
def test_numbers_keep_their_value_through_go_formatting(number: float) -> None:
    value = float(number)
    if math.isinf(value):  # an integer beyond float64: Go cannot decode it either
        return
    text = goencoding.format_number(value)
    assert float(text) == value
    assert goencoding.loads(text.encode()) == value
