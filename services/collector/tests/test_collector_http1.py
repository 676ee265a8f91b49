"""The sans-IO HTTP/1.1 response parser: tables of streams and what they read as, the limits, and
hypothesis properties (any split of a stream reads the same; generated responses read back whole).

The atheris target ``http1`` (bench/fuzz/targets.py) checks the same property coverage-guided; its seeds
are replayed here and its crash files by ``test_every_crash_atheris_found_stays_fixed``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pointsman_collector.http1 import CLOSED, Head, Response

FUZZ = Path(__file__).resolve().parents[3] / "bench" / "fuzz"
sys.path.insert(0, str(FUZZ))
import targets  # noqa: E402

SEEDS = sorted((FUZZ / "seeds" / "http1").glob("*"))
LIMITS = targets.HTTP1_LIMITS  # max_head 512, field line 128, 8 field lines, body 1024, chunk line 64
OK = b"HTTP/1.1 200 OK\r\n"
CHUNKED = OK + b"Transfer-Encoding: chunked\r\n\r\n"


def read(stream: bytes, *, eof: bool = True) -> list[object]:
    """The stream's responses as (status, body, keep_alive), "closed", or ("error", detail, too_large)."""
    seen: list[object] = []
    for event in targets.http1_outcome([stream], LIMITS, eof=eof):
        if isinstance(event, Response):
            seen.append((event.status, event.body, event.keep_alive))
        elif event is CLOSED:
            seen.append("closed")
        elif not isinstance(event, Head):
            seen.append(event)
    return seen


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        (OK + b"Content-Length: 2\r\n\r\nok", [(200, b"ok", True), "closed"]),
        (
            OK + b"content-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n!",
            [(200, b"ok", True), (200, b"!", True), "closed"],
        ),
        (CHUNKED + b"3\r\nabc\r\n0\r\n\r\n", [(200, b"abc", True), "closed"]),
        (
            CHUNKED + b'00A;name=value\r\n0123456789\r\n1 \t; a ; b="c"\r\nx\r\n0\r\n\r\n',
            [(200, b"0123456789x", True), "closed"],
        ),
        (CHUNKED + b"1\r\nx\r\n0\r\nX-Trailer: 1\r\nY: 2\r\n\r\n", [(200, b"x", True), "closed"]),
        (OK + b"Transfer-Encoding: , Chunked\r\n\r\n0\r\n\r\n", [(200, b"", True), "closed"]),
        (OK + b"\r\nuntil the end", [(200, b"until the end", False), "closed"]),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", [(200, b"x", False), "closed"]),
        (
            b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 1\r\n\r\nx",
            [(200, b"x", True), "closed"],
        ),
        (OK + b"Connection: keep-alive, close\r\nContent-Length: 0\r\n\r\n", [(200, b"", False), "closed"]),
        (OK + b"Connection: closed\r\nContent-Length: 0\r\n\r\n", [(200, b"", True), "closed"]),
        (OK + b"Content-Length: 2, 2\r\nContent-Length: 02\r\n\r\nok", [(200, b"ok", True), "closed"]),
        (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
            + OK
            + b"Content-Length: 0\r\n\r\n",
            [(200, b"", True), "closed"],
        ),
        (
            b"HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\nHTTP/1.1 304 Not Modified\r\n\r\n",
            [(204, b"", True), (304, b"", True), "closed"],
        ),
        (
            b"HTTP/1.1 500 \r\nContent-Length: 0\r\n\r\nHTTP/1.1 404\r\nContent-Length: 0\r\n\r\n",
            [(500, b"", True), (404, b"", True), "closed"],
        ),
        (
            OK + b"X-Folded: a\r\n  b\r\n\tc\r\nX-Text: caf\xc3\xa9 \x80\xff\r\nContent-Length: 0\r\n\r\n",
            [(200, b"", True), "closed"],
        ),
        (b"", ["closed"]),
    ],
    ids=[
        "content-length",
        "two responses, any case",
        "chunked",
        "chunk sizes in any case with extensions",
        "trailers",
        "an empty list element",
        "until the end",
        "HTTP/1.0 closes",
        "HTTP/1.0 keep-alive",
        "connection close among tokens",
        "a token containing close is not close",
        "the same Content-Length, listed and repeated",
        "interim responses skipped",
        "204 and 304 have no body",
        "empty or no reason",
        "obs-fold and obs-text",
        "nothing, then the end",
    ],
)
def test_reads_what_the_server_sent(stream: bytes, expected: list[object]) -> None:
    assert read(stream) == expected


def test_head_says_the_type_the_framing_and_unfolds_obs_fold() -> None:
    stream = OK + b"Content-Type: Text/Plain;\r\n version=0.0.4\r\nContent-Length: 0\r\n\r\n"
    head = targets.http1_outcome([stream], LIMITS)[0]
    assert head == Head(200, b"text/plain; version=0.0.4", keep_alive=True, length=0, chunked=False)


def error(detail: str, *, too_large: bool = False) -> list[object]:
    return [("error", detail, too_large)]


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        # the status line
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", error("bad status line b'SSH-2.0-OpenSSH_9.6'")),
        (b"HTTP/1.2 200 OK\r\n\r\n", error("bad status line b'HTTP/1.2 200 OK'")),
        (b"http/1.1 200 OK\r\n\r\n", error("bad status line b'http/1.1 200 OK'")),
        (b"HTTP/1.1 20 OK\r\n\r\n", error("bad status line b'HTTP/1.1 20 OK'")),
        (b"HTTP/1.1 2000 OK\r\n\r\n", error("bad status line b'HTTP/1.1 2000 OK'")),
        (b"HTTP/1.1 099 Low\r\n\r\n", error("bad status line b'HTTP/1.1 099 Low'")),
        (b"HTTP/1.1  200 OK\r\n\r\n", error("bad status line b'HTTP/1.1  200 OK'")),
        (
            b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
            error("101 Switching Protocols, and nothing asked for an upgrade"),
        ),
        # line ends and field lines
        (b"HTTP/1.1 200 OK\nContent-Length: 0\n\n", error("bare LF in the head")),
        (OK + b"A: b\nC: d\r\n\r\n", error("bare LF in a field line")),
        (OK + b"A: b\rC: d\r\n\r\n", error("bare CR in a field line")),
        (b"HTTP/1.1 200 O\rK\r\n\r\n", error("bare CR in a status line")),
        (OK + b"Content-Length : 0\r\n\r\n", error("bad field line b'Content-Length : 0'")),
        (OK + b"broken header\r\n\r\n", error("bad field line b'broken header'")),
        (OK + b": empty name\r\n\r\n", error("bad field line b': empty name'")),
        (OK + b"A: nul\x00\r\n\r\n", error("bad field line b'A: nul\\x00'")),
        (OK + b"A: del\x7f\r\n\r\n", error("bad field line b'A: del\\x7f'")),
        (
            OK + b" A: folded into the status line\r\n\r\n",
            error("bad field line b' A: folded into the status line'"),
        ),
        (OK + b"Content-Type: a\r\nContent-Type: a\r\n\r\n", error("two Content-Types")),
        # framing
        (OK + b"Content-Length: 1x\r\n\r\n", error("bad Content-Length b'1x'")),
        (OK + b"Content-Length: +5\r\n\r\n", error("bad Content-Length b'+5'")),
        (OK + b"Content-Length: -1\r\n\r\n", error("bad Content-Length b'-1'")),
        (OK + b"Content-Length:\r\n\r\n", error("bad Content-Length b''")),
        (
            OK + b"Content-Length: 1234567890123456789\r\n\r\n",
            error("bad Content-Length b'1234567890123456789'"),
        ),
        (OK + b"Content-Length: 2, 3\r\n\r\n", error("two different Content-Lengths")),
        (OK + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\nabc", error("two different Content-Lengths")),
        (
            OK + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            error("Transfer-Encoding with Content-Length"),
        ),
        (OK + b"Transfer-Encoding: gzip\r\n\r\n", error("Transfer-Encoding b'gzip': only chunked is read")),
        (
            OK + b"Transfer-Encoding: gzip, chunked\r\n\r\n",
            error("Transfer-Encoding b'gzip, chunked': only chunked is read"),
        ),
        (
            OK + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            error("Transfer-Encoding b'chunked, chunked': only chunked is read"),
        ),
        (
            b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            error("Transfer-Encoding in an HTTP/1.0 response"),
        ),
        # chunks
        (CHUNKED + b"zz\r\n", error("bad chunk-size line b'zz'")),
        (CHUNKED + b"+a\r\n0123456789\r\n0\r\n\r\n", error("bad chunk-size line b'+a'")),
        (CHUNKED + b"0x3\r\nabc\r\n0\r\n\r\n", error("bad chunk-size line b'0x3'")),
        (CHUNKED + b"1_0\r\n", error("bad chunk-size line b'1_0'")),
        (CHUNKED + b" 3\r\n", error("bad chunk-size line b' 3'")),
        (CHUNKED + b"-1\r\n", error("bad chunk-size line b'-1'")),
        (CHUNKED + b"00000000000000001\r\n", error("bad chunk-size line b'00000000000000001'")),
        (CHUNKED + b"3\nabc\r\n", error("bare LF in a chunk-size line")),
        (CHUNKED + b"3\r\nabcXY", error("chunk data not followed by CRLF")),
        (CHUNKED + b"1;" + b"e" * 63 + b"\r\n", error("chunk-size line over 64 bytes")),
        (CHUNKED + b"0\r\nX: 1\nY: 2\n\n", error("bare LF in the trailers")),
        (CHUNKED + b"0\r\nnot a trailer\r\n\r\n", error("bad field line b'not a trailer'")),
        # the end of the stream too soon
        (OK + b"Content-", error("connection closed before the response head ended")),
        (b"HTTP/1.1 100 Continue\r\n\r\n", error("connection closed before the response head ended")),
        (OK + b"Content-Length: 100\r\n\r\nshort", error("connection closed mid-body")),
        (CHUNKED + b"3\r\nab", error("connection closed mid-body")),
        (CHUNKED + b"0\r\n", error("connection closed mid-body")),
        (CHUNKED + b"0\r\nX: 1\r\n", error("connection closed mid-body")),
    ],
    ids=lambda value: str(value[0][1])[:50] if isinstance(value, list) else "",
)
def test_refuses_what_breaks_http_1_1(stream: bytes, expected: list[object]) -> None:
    assert read(stream) == expected


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        (OK + b"X: " + b"a" * 600 + b"\r\n\r\n", error("response head over 512 bytes")),
        (OK + b"X: " + b"a" * 600, error("response head over 512 bytes")),
        (
            (b"HTTP/1.1 100 Continue\r\nX: " + b"a" * 100 + b"\r\n\r\n") * 5 + OK + b"\r\n",
            error("response head over 512 bytes"),
        ),
        (OK + b"X: " + b"a" * 126 + b"\r\n\r\n", error("field line over 128 bytes")),
        (OK + b"X: a\r\n" * 9 + b"\r\n", error("more than 8 field lines")),
        (b"HTTP/1.1 200 " + b"x" * 130 + b"\r\n\r\n", error("status line over 128 bytes")),
        (OK + b"Content-Length: 1025\r\n\r\n", error("body over 1024 bytes", too_large=True)),
        (OK + b"Content-Length: 1024\r\n\r\n" + b"x" * 1024, [(200, b"x" * 1024, True), "closed"]),
        (CHUNKED + b"400\r\n" + b"x" * 1024 + b"\r\n1\r\n", error("body over 1024 bytes", too_large=True)),
        (CHUNKED + b"ffffffffffffffff\r\n", error("body over 1024 bytes", too_large=True)),
        (OK + b"\r\n" + b"x" * 1025, error("body over 1024 bytes", too_large=True)),
        (OK + b"\r\n" + b"x" * 1024, [(200, b"x" * 1024, False), "closed"]),
        # 1-byte chunks in long extensions: more framing than the body may take on the wire
        (CHUNKED + (b"1;" + b"e" * 60 + b"\r\nx\r\n") * 40, error("body over 1024 bytes", too_large=True)),
        (
            CHUNKED + b"0\r\n" + (b"X: " + b"1" * 100 + b"\r\n") * 6 + b"\r\n",
            error("trailers over 512 bytes"),
        ),
    ],
    ids=[
        "head",
        "head never ending",
        "interim heads together",
        "field line",
        "field lines",
        "status line",
        "content-length",
        "content-length at the limit",
        "chunks",
        "chunk size",
        "until the end",
        "until the end at the limit",
        "chunk framing",
        "trailers",
    ],
)
def test_holds_every_limit(stream: bytes, expected: list[object]) -> None:
    assert read(stream) == expected


def test_an_announced_body_over_the_limit_is_refused_before_it_arrives() -> None:
    for stream in (OK + b"Content-Length: 99999\r\n\r\n", CHUNKED + b"10000\r\n"):
        assert read(stream, eof=False) == error("body over 1024 bytes", too_large=True)


def test_a_broken_parser_stays_broken() -> None:
    outcome = targets.http1_outcome([b"HTTP/9\r\n\r\n", OK + b"Content-Length: 0\r\n\r\n"], LIMITS)
    assert outcome == error("bad status line b'HTTP/9'")


def test_every_seed_reads_alike_whole_and_cut() -> None:
    assert SEEDS
    for seed in SEEDS:
        targets.run("http1", seed.read_bytes())


# -- hypothesis -------------------------------------------------------------------------------------------
names = st.sampled_from([b"Content-Type", b"X-Request-Id", b"Date", b"Server", b"Vary"])
values = st.binary(max_size=30).map(lambda v: bytes(b for b in v if 0x21 <= b <= 0x7E or b >= 0x80))
fields = st.lists(st.tuples(names, values), max_size=4, unique_by=lambda field: field[0])
bodies = st.binary(max_size=300)


@st.composite
def responses(draw: st.DrawFn) -> tuple[bytes, bytes, bool]:
    """One response on a kept-alive connection: its bytes, its body, and whether it keeps the
    connection (one read until the end of the stream comes last)."""
    body = draw(bodies)
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(n + b": " + v + b"\r\n" for n, v in draw(fields))
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    if framing == "length":
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body, body, True
    if framing == "close":
        return head + b"Connection: close\r\n\r\n" + body, body, False
    sizes = draw(st.lists(st.integers(1, 100), max_size=8))
    chunks, at = [], 0
    for size in [*sizes, len(body)]:
        piece = body[at : at + size]
        at += len(piece)
        if piece:
            chunks.append(b"%x\r\n%s\r\n" % (len(piece), piece))
    return head + b"Transfer-Encoding: chunked\r\n\r\n" + b"".join(chunks) + b"0\r\n\r\n", body, True


def cut(stream: bytes, at: list[int]) -> list[bytes]:
    points = sorted({point % (len(stream) + 1) for point in at})
    return [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]


@given(st.lists(responses(), min_size=1, max_size=4), st.lists(st.integers(0, 10_000), max_size=12))
def test_responses_read_back_whole_however_the_stream_is_cut(
    sent: list[tuple[bytes, bytes, bool]], at: list[int]
) -> None:
    # Responses until the first that reads until the end of the stream.
    kept = [*[r for r in sent if r[2]], *[r for r in sent if not r[2]][:1]]
    stream = b"".join(r[0] for r in kept)
    outcome = targets.http1_outcome(cut(stream, at), LIMITS)
    assert outcome == targets.http1_outcome([stream], LIMITS)
    assert [e.body for e in outcome if isinstance(e, Response)] == [r[1] for r in kept]


@given(
    st.lists(responses(), min_size=1, max_size=3),
    st.integers(0, 10_000),
    st.binary(max_size=3),
    st.integers(1, 64),
)
def test_a_damaged_stream_reads_alike_in_any_reads(
    sent: list[tuple[bytes, bytes, bool]], where: int, damage: bytes, step: int
) -> None:
    stream = b"".join(r[0] for r in sent)
    where %= len(stream) + 1
    targets.run("http1", bytes([step]) + stream[:where] + damage + stream[where + 1 :])


@given(st.binary(max_size=600))
def test_any_bytes_read_alike_in_any_reads(data: bytes) -> None:
    targets.run("http1", data)
