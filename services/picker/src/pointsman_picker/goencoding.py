"""JSON as Go's ``encoding/json`` reads into and writes from a ``map[string]interface{}`` (spec §1).

Upstream decodes the request body into a map and, when it rewrites ``model``, encodes the map again.
Pointsman must produce the same bytes, so this module reproduces both directions:

- decoding: numbers become float64 (``1e400`` is an error); invalid UTF-8 inside strings becomes U+FFFD,
  one per bad byte; a lone UTF-16 surrogate escape becomes U+FFFD;
- encoding: object keys sorted by bytes, no spaces, ``<``, ``>``, ``&``, U+2028 and U+2029 escaped as
  ``\\u003c``-style escapes, other non-ASCII kept as UTF-8, ``\\b \\f \\n \\r \\t`` short escapes (Go
  >= 1.22), other control characters as ``\\u00XX``; numbers formatted like ES6: shortest digits, plain
  notation for 1e-6 <= |x| < 1e21, else exponent notation (``1e+21``, ``1e-7``).
"""

from __future__ import annotations

import codecs
import json
import math
import re
from typing import Any

import orjson

_DECODE_ERRORS = "pointsman-go-replace"


def _replace_one_byte(error: UnicodeError) -> tuple[str, int]:
    # Go's decoder replaces each byte of an invalid sequence by itself; Python's "replace" would
    # replace a maximal invalid subsequence by one U+FFFD.
    if not isinstance(error, UnicodeDecodeError):
        raise error
    return "\ufffd", error.start + 1


codecs.register_error(_DECODE_ERRORS, _replace_one_byte)


def loads(data: bytes) -> Any:
    """Decode like Go's ``json.Unmarshal`` into ``interface{}``; raise ``ValueError`` when Go would fail."""
    text = data.decode("utf-8", _DECODE_ERRORS)
    try:
        value = json.loads(text, parse_int=_go_float, parse_float=_go_float, parse_constant=_no_constant)
        # Python keeps a lone surrogate escape ("\ud800") as a surrogate, which no UTF-8 encoder takes
        # (a model passed through as a metric label broke /metrics); Go reads it as U+FFFD.
        if "\\u" in text and _SURROGATE_ESCAPE.search(text):
            value = _replace_surrogates(value)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    return value


# A \uD800-\uDFFF escape: maybe half of a valid pair, which json.loads joins; the rest are lone.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _go_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise ValueError(f"number {literal} is out of the range of a float64")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"invalid JSON literal {name}")


def dumps(value: Any) -> bytes:
    """Encode like Go's ``json.Marshal`` of what :func:`loads` returns."""
    out: list[bytes] = []
    try:
        _encode(value, out)
    except orjson.JSONEncodeError:  # a lone surrogate (from a "\\ud800" escape): U+FFFD, as in Go
        out = []
        _encode(_replace_surrogates(value), out)
    return b"".join(out)


def _encode(value: Any, out: list[bytes]) -> None:
    if isinstance(value, str):
        out.append(encode_string(value))
    elif value is None:
        out.append(b"null")
    elif value is True:
        out.append(b"true")
    elif value is False:
        out.append(b"false")
    elif isinstance(value, int | float):
        out.append(format_number(float(value)).encode())
    elif isinstance(value, dict):
        out.append(b"{")
        first = True
        for key in sorted(value):  # code point order is UTF-8 byte order, as Go sorts
            if not first:
                out.append(b",")
            first = False
            out.append(encode_string(key))
            out.append(b":")
            _encode(value[key], out)
        out.append(b"}")
    elif isinstance(value, list | tuple):
        out.append(b"[")
        for i, item in enumerate(value):
            if i:
                out.append(b",")
            _encode(item, out)
        out.append(b"]")
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as JSON")


_SURROGATE = re.compile("[\ud800-\udfff]")
# orjson escapes '"', '\\', \b \f \n \r \t and other controls as \u00xx, like Go >= 1.22, and keeps
# non-ASCII as UTF-8; Go additionally escapes these (looked for in the text: a bytes search would first
# try the needle as an int, and raise; replaced in the UTF-8 bytes, where no other character's
# encoding contains them):
_HTML_SAFE = tuple((char, char.encode(), f"\\u{ord(char):04x}".encode()) for char in "<>&\u2028\u2029")


def _replace_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_SURROGATE.sub("\ufffd", k): _replace_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_surrogates(v) for v in value]
    return value


def encode_string(text: str) -> bytes:
    """``text`` as a JSON string in Go's escaping; ``orjson.JSONEncodeError`` for a lone surrogate.
    (orjson escapes a 4 KB prompt in a twentieth of the time json's C encoder takes.)"""
    encoded = orjson.dumps(text)
    for char, utf8, escape in _HTML_SAFE:
        if char in text:
            encoded = encoded.replace(utf8, escape)
    return encoded


_EXACT_INTEGERS = 2.0**53


def format_number(value: float) -> str:
    """Go's float64 encoding: ``strconv.AppendFloat(f, 'f' or 'e', -1, 64)`` with ES6 cutoffs."""
    magnitude = abs(value)
    # Fast paths, where Python's repr already writes what Go writes.
    if value.is_integer() and magnitude < _EXACT_INTEGERS:
        if value == 0:
            return "-0" if math.copysign(1.0, value) < 0 else "0"
        return str(int(value))
    if 1e-4 <= magnitude < 1e16 and not value.is_integer():
        return repr(value)
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"unsupported value: {value}")
    sign = "-" if value < 0 else ""
    digits, point = _shortest_digits(magnitude)
    if magnitude < 1e-6 or magnitude >= 1e21:
        exponent = point - 1
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        # %e pads the exponent to two digits; Go then trims "e-07" to "e-7" (but keeps "e+21").
        exp_text = f"{exponent:+03d}" if exponent > 0 else f"-{-exponent}"
        return f"{sign}{mantissa}e{exp_text}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"


def _shortest_digits(value: float) -> tuple[str, int]:
    """The shortest round-trip decimal digits of ``value > 0`` and the position of the decimal point:
    ``value == 0.DIGITS * 10**point``."""
    mantissa, _, exp = repr(value).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    point = len(whole) + (int(exp) if exp else 0)
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    return stripped.rstrip("0"), point
