"""HTTP/1.1 responses (RFC 9112), parsed sans-IO: bytes in, events out; no socket, no clock.

The scrape client (:mod:`pointsman_collector.httpclient`) drives a :class:`ResponseParser` from its
asyncio protocol; the tests and the fuzz target feed one bytes directly. As h11's ``Connection`` does,
it reads one response after another from a kept-alive connection:

- bytes go in with :meth:`~ResponseParser.receive_data` (a copy), or straight into the parser's own
  buffer (:meth:`~ResponseParser.get_buffer`, then :meth:`~ResponseParser.buffer_updated`), which is
  how an ``asyncio.BufferedProtocol`` reads: a page is then copied once, into its body. The end of
  the stream goes in with :meth:`~ResponseParser.receive_eof`;
- :meth:`~ResponseParser.next_event` answers :data:`NEED_DATA`, a :class:`Head` once a head is whole,
  then its :class:`Response` once the body is, or :data:`CLOSED` when the peer hung up before a next
  response began. Interim (1xx) responses are skipped;
- any breach of HTTP/1.1 or of the :class:`Limits` raises :class:`ResponseError`, the one error type,
  and the parser stays broken: the connection cannot be trusted with another response.

Where RFC 9112 lets a recipient choose, this parser refuses (llhttp's strict mode does the same; h11
0.16 is more lenient in the places marked):

- lines end in CRLF: a bare LF or CR anywhere in a head, chunk line or trailer is an error (RFC 9112
  §2.2 allows a recipient to accept a bare LF; h11 does);
- whitespace between a field name and its colon, a control character or DEL in a value, whitespace
  before the first field line: errors. An obs-fold (a line that starts with SP or HTAB) is unfolded
  into one SP, as RFC 9112 §5.2 requires of a user agent (and h11 does);
- Content-Length is digits only, at most 18 of them; repeated or listed (``5, 5``) it must say the same
  each time (RFC 9110 §8.6, as h11); two different values are an error;
- Transfer-Encoding must be exactly ``chunked`` (the request asks for no other coding), in an
  HTTP/1.1 response, and without a Content-Length: both together is how responses are split and
  requests smuggled (RFC 9112 §6.3 says "ought to be handled as an error"; h11 lets chunked win);
- a chunk size is 1 to 16 hex digits, nothing else (``int(x, 16)`` would take ``+a``, ``0x1``,
  ``1_0``); a chunk extension is read over and dropped;
- two Content-Type fields are an error (the page's type decides whether its numbers are used);
- a status line is ``HTTP/1.0`` or ``HTTP/1.1``, three digits, then an optional reason (a missing SP
  before an empty reason is tolerated, as h11 does); ``101 Switching Protocols`` is an error, as nothing
  asked for an upgrade.

Limits, all in :class:`Limits`: the head (interim heads included) and the trailers ``max_head`` bytes
each, a field line ``max_field_line``, ``max_fields`` field lines, a body ``max_body`` (announced by
Content-Length or a chunk size: refused before it arrives), a chunk-size line ``max_chunk_line``, and a
chunked body's bytes on the wire (framing included) twice ``max_body``: without that, 1-byte chunks
with 4 KB extensions would cost 4,000 bytes read per byte of body. Chunks are copied out as they
complete, and the buffer drops what was read, so what it holds unread is one head, or one chunk with
its line (provided :meth:`~ResponseParser.next_event` runs after each read, as a protocol does).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple


class ResponseError(Exception):
    """The response broke HTTP/1.1 or one of the :class:`Limits`. ``too_large``: it was the body that
    went over ``max_body`` (or a chunked body's wire bytes over twice that)."""

    def __init__(self, detail: str, *, too_large: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.too_large = too_large


@dataclass(frozen=True, slots=True)
class Limits:
    """What one response may take. h11's and httpx's limits beside these: docs/decisions/httpclient.md."""

    max_head: int = 16 * 1024  # status line, field lines and the blank line; h11's default
    max_field_line: int = 8 * 1024
    max_fields: int = 100  # as Python's http.client
    # vLLM pages are 15-80 KB; a page far larger is a misconfigured target, not a model server.
    max_body: int = 4 * 1024 * 1024
    max_chunk_line: int = 4096


class Signal(enum.Enum):
    NEED_DATA = "need data"
    CLOSED = "closed"


NEED_DATA: Final = Signal.NEED_DATA  # feed more bytes (or the end of the stream)
CLOSED: Final = Signal.CLOSED  # the stream ended where a next response would have begun


class Head(NamedTuple):
    # NamedTuples, not frozen dataclasses: one is built per response, and a frozen dataclass costs
    # several times as much to build.
    status: int
    content_type: bytes | None  # as sent, lower-cased; None when the server sent none
    keep_alive: bool  # the server will take another request on this connection
    length: int | None  # the body's length when known: Content-Length, or 0 for 204 and 304
    chunked: bool


class Response(NamedTuple):
    status: int
    body: bytes
    content_type: bytes | None
    keep_alive: bool


Event = Head | Response | Literal[Signal.NEED_DATA, Signal.CLOSED]

_CRLF: Final = b"\r\n"
_HEAD_END: Final = b"\r\n\r\n"
_TOKEN: Final = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_TEXT: Final = rb"[\t\x20-\x7e\x80-\xff]*"  # a field value, a reason phrase: no control byte, no DEL
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-9][0-9][0-9])(?: " + _TEXT + rb")?")
_FIELD_LINE = re.compile(rb"(" + _TOKEN + rb"):(" + _TEXT + rb")")
_FOLDED = re.compile(rb"[ \t]" + _TEXT)
# A whole head without obs-fold, in one pass: what nearly every server sends. Anything else (and every
# error) goes line by line, which says what is wrong.
_HEAD = re.compile(
    rb"HTTP/1\.([01]) ([1-9][0-9][0-9])(?: "
    + _TEXT
    + rb")?\r\n((?:"
    + _TOKEN
    + rb":"
    + _TEXT
    + rb"\r\n)*)\r\n"
)
_FRAMING = frozenset((b"content-length", b"transfer-encoding", b"content-type", b"connection"))
_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;" + _TEXT + rb")?")
_LENGTH = re.compile(rb"[0-9]{1,18}")

# The parser's states: what the bytes at the read position are.
_READING_HEAD: Final = 0
_READING_LENGTH: Final = 1  # a body of Content-Length bytes
_READING_UNTIL_CLOSE: Final = 2
_READING_CHUNKS: Final = 3
_READING_TRAILERS: Final = 4


class ResponseParser:
    """Responses read from one connection's bytes, one after another. Not thread-safe; no I/O."""

    def __init__(self, limits: Limits, *, initial_buffer: int = 64 * 1024) -> None:
        self.limits = limits
        # Kept across responses (and doubled when one does not fit), so after the first one the bytes
        # land in memory that is already there.
        self._buffer = bytearray(initial_buffer)
        self._view = memoryview(self._buffer)
        self._max_buffer = max(limits.max_head, limits.max_chunk_line + limits.max_body + 4)
        self._size = 0  # bytes of the buffer received
        self._pos = 0  # where the bytes not parsed yet start
        self._eof = False
        self._error: ResponseError | None = None
        self._state = _READING_HEAD
        self._interim = 0  # head bytes of the interim responses skipped before this one
        self._head: Head | None = None
        self._length = 0  # the body's, when it has a Content-Length
        self._raw_head = b""  # the last head parsed, and what it said: servers repeat theirs
        self._parsed_head: Head | None = None
        self._body = bytearray()  # a chunked body so far: one growing copy, not an object per chunk
        self._wire = 0  # a chunked body's bytes so far, framing included

    @property
    def buffered(self) -> int:
        """Bytes received and not parsed yet: after a :class:`Response`, bytes nobody asked for."""
        return self._size - self._pos

    @property
    def between_responses(self) -> bool:
        """No byte of a next response has arrived (what a hang-up on a reused connection means)."""
        return self._state == _READING_HEAD and self._size == self._pos and not self._interim

    # feeding

    def get_buffer(self) -> memoryview:
        """Where the next bytes go (never empty); say how many arrived with :meth:`buffer_updated`."""
        if self._size == len(self._buffer):
            self._make_room()
        return self._view[self._size :]

    def buffer_updated(self, nbytes: int) -> None:
        self._size += nbytes

    def receive_data(self, data: bytes) -> None:
        """Copy ``data`` in (the protocol's reads go through :meth:`get_buffer` instead)."""
        at = 0
        while at < len(data):
            view = self.get_buffer()
            count = min(len(view), len(data) - at)
            view[:count] = data[at : at + count]
            self._size += count
            at += count

    def receive_eof(self) -> None:
        self._eof = True

    def _make_room(self) -> None:
        unread = self._size - self._pos
        length = len(self._buffer)
        # Doubled while it is smaller than what one state may leave unread: a long body then comes in
        # reads as large as the socket has, not in reads of what a small buffer has left.
        if length < self._max_buffer or 2 * unread > length:
            length *= 2
        # A new buffer, not a move in place: the event loop may still hold a view of the old one.
        buffer = bytearray(length)
        buffer[:unread] = self._view[self._pos : self._size]
        self._buffer, self._view = buffer, memoryview(buffer)
        self._size, self._pos = unread, 0

    # reading

    def next_event(self) -> Event:
        """What the bytes so far make: raises :class:`ResponseError`, then again on every call."""
        if self._error is not None:
            raise self._error
        try:
            state = self._state
            if state == _READING_HEAD:
                return self._read_head()
            if state == _READING_LENGTH:
                return self._read_length()
            if state == _READING_CHUNKS:
                return self._read_chunks()
            if state == _READING_TRAILERS:
                return self._read_trailers()
            return self._read_until_close()
        except ResponseError as exc:
            self._error = exc
            raise

    def _read_head(self) -> Event:
        max_head = self.limits.max_head
        while True:
            pos, size = self._pos, self._size
            room = max_head - self._interim  # what this head may take
            end = self._buffer.find(_HEAD_END, pos, size)
            # Checked in the order the bytes come, so any split of the stream fails alike.
            if self._buffer.find(b"\n\n", pos, min(size if end < 0 else end + 2, pos + room)) >= 0:
                raise ResponseError("bare LF in the head")
            if end < 0:
                if size - pos > room:
                    raise ResponseError(f"response head over {max_head} bytes")
                if self._eof:
                    if size == pos and not self._interim:
                        return CLOSED
                    raise ResponseError("connection closed before the response head ended")
                return NEED_DATA
            stop = end + 4
            if stop - pos > room:
                raise ResponseError(f"response head over {max_head} bytes")
            raw = bytes(self._view[pos:stop])
            head = self._parsed_head
            if raw != self._raw_head or head is None:
                head = _parse_head(raw, self.limits)
                self._raw_head, self._parsed_head = raw, head
            self._pos = stop
            if head.status < 200:
                self._interim += stop - pos
                continue
            self._interim = 0
            self._head = head
            if head.length is not None:
                self._state = _READING_LENGTH
                self._length = head.length
            elif head.chunked:
                self._state = _READING_CHUNKS
                self._body = bytearray()
                self._wire = 0
            else:
                self._state = _READING_UNTIL_CLOSE
            return head

    def _read_length(self) -> Event:
        start, length = self._pos, self._length
        if self._size - start >= length:
            self._pos = start + length
            return self._finish(bytes(self._view[start : start + length]))
        if self._eof:
            raise ResponseError("connection closed mid-body")
        return NEED_DATA

    def _read_until_close(self) -> Event:
        if self._size - self._pos > self.limits.max_body:
            raise _too_large(self.limits)
        if self._eof:
            body = bytes(self._view[self._pos : self._size])
            self._pos = self._size
            return self._finish(body)
        return NEED_DATA

    def _read_chunks(self) -> Event:
        buffer, view, filled, pos = self._buffer, self._view, self._size, self._pos
        limits = self.limits
        while True:
            line_end = buffer.find(_CRLF, pos, filled)
            if (filled if line_end < 0 else line_end) - pos > limits.max_chunk_line:
                raise ResponseError(f"chunk-size line over {limits.max_chunk_line} bytes")
            if line_end < 0:
                break
            match = _CHUNK_LINE.fullmatch(buffer, pos, line_end)
            if match is None:
                line = bytes(buffer[pos:line_end])
                raise ResponseError(_bad_line("chunk-size line", line))
            size = int(match[1], 16)
            wire = self._wire + line_end + 2 - pos + size + (2 if size else 0)
            if len(self._body) + size > limits.max_body or wire > 2 * limits.max_body:
                raise _too_large(limits)
            if size == 0:
                self._wire = wire
                self._pos = line_end + 2
                self._state = _READING_TRAILERS
                return self._read_trailers()
            data_end = line_end + 2 + size
            if filled < data_end + 2:
                break
            if not buffer.startswith(_CRLF, data_end):
                raise ResponseError("chunk data not followed by CRLF")
            self._body += view[line_end + 2 : data_end]
            self._wire = wire
            pos = data_end + 2
        self._pos = pos
        if self._eof:
            raise ResponseError("connection closed mid-body")
        return NEED_DATA

    def _read_trailers(self) -> Event:
        """The trailer section after the last chunk: field lines (read and dropped), then CRLF."""
        buffer, pos, size = self._buffer, self._pos, self._size
        max_head = self.limits.max_head
        if size - pos < 2:
            if self._eof:
                raise ResponseError("connection closed mid-body")
            return NEED_DATA
        if buffer.startswith(_CRLF, pos):
            stop = pos + 2
        else:
            end = buffer.find(_HEAD_END, pos, size)
            if buffer.find(b"\n\n", pos, min(size if end < 0 else end + 2, pos + max_head)) >= 0:
                raise ResponseError("bare LF in the trailers")
            if (size if end < 0 else end + 4) - pos > max_head:
                raise ResponseError(f"trailers over {max_head} bytes")
            if end < 0:
                if self._eof:
                    raise ResponseError("connection closed mid-body")
                return NEED_DATA
            _parse_fields(bytes(buffer[pos:end]).split(_CRLF), self.limits)
            stop = end + 4
        self._pos = stop
        body, self._body = bytes(self._body), bytearray()
        return self._finish(body)

    def _finish(self, body: bytes) -> Response:
        head = self._head
        assert head is not None
        self._head = None
        self._state = _READING_HEAD
        if self._pos == self._size:
            self._pos = self._size = 0  # the next response starts at the buffer's start: no move
        return Response(head.status, body, head.content_type, head.keep_alive)


def _too_large(limits: Limits) -> ResponseError:
    return ResponseError(f"body over {limits.max_body} bytes", too_large=True)


def _bad_line(what: str, line: bytes) -> str:
    if b"\n" in line:
        return f"bare LF in a {what}"
    if b"\r" in line:
        return f"bare CR in a {what}"
    return f"bad {what} {line[:60]!r}"


def _parse_head(raw: bytes, limits: Limits) -> Head:
    """A head (status line to blank line) as its :class:`Head`; raises :class:`ResponseError`."""
    match = _HEAD.fullmatch(raw)
    if match is None or len(raw) > limits.max_field_line or raw.count(_CRLF) - 2 > limits.max_fields:
        return _parse_head_by_line(raw, limits)
    # Valid and within the limits (no line is longer than the whole head): read the framing fields.
    # (A loop over the lines costs two thirds of a case-insensitive regex search for these names.)
    fields = []
    for line in match[3].split(_CRLF)[:-1]:
        name, _, value = line.partition(b":")
        name = name.lower()
        if name in _FRAMING:
            fields.append((name, value.strip(b" \t")))
    return _head(match[1] == b"1", int(match[2]), fields, limits)


def _parse_head_by_line(raw: bytes, limits: Limits) -> Head:
    """:func:`_parse_head` for any head: each line checked in turn, obs-folds unfolded."""
    lines = raw[:-4].split(_CRLF)
    status_line = lines[0]
    if len(status_line) > limits.max_field_line:
        raise ResponseError(f"status line over {limits.max_field_line} bytes")
    match = _STATUS_LINE.fullmatch(status_line)
    if match is None:
        raise ResponseError(_bad_line("status line", status_line))
    return _head(match[1] == b"1", int(match[2]), _parse_fields(lines[1:], limits), limits)


def _head(http11: bool, status: int, fields: list[tuple[bytes, bytes]], limits: Limits) -> Head:
    """What the status and the fields say of the body and the connection."""
    if status == 101:
        raise ResponseError("101 Switching Protocols, and nothing asked for an upgrade")
    if status < 200:
        return Head(status, None, http11, 0, False)  # interim: no body, its fields are not the response's
    keep_alive = http11
    length: int | None = None
    codings: list[bytes] = []
    content_type: bytes | None = None
    for name, value in fields:
        if name == b"content-length":
            if value.isdigit() and len(value) <= 18 and length is None:  # the usual: one plain number
                length = int(value)
                continue
            for item in value.split(b","):
                item = item.strip(b" \t")
                if _LENGTH.fullmatch(item) is None:
                    raise ResponseError(f"bad Content-Length {value[:30]!r}")
                if length is not None and int(item) != length:
                    raise ResponseError("two different Content-Lengths")
                length = int(item)
        elif name == b"transfer-encoding":
            codings.extend(_tokens(value))
        elif name == b"content-type":
            if content_type is not None:
                raise ResponseError("two Content-Types")
            content_type = value.lower()
        elif name == b"connection":
            tokens = _tokens(value)
            if b"close" in tokens:
                keep_alive = False
            elif b"keep-alive" in tokens:
                keep_alive = True
    if status in (204, 304):
        return Head(status, content_type, keep_alive, 0, False)  # never a body (RFC 9112 §6.3)
    if codings:
        if codings != [b"chunked"]:
            raise ResponseError(f"Transfer-Encoding {b', '.join(codings)[:40]!r}: only chunked is read")
        if length is not None:
            raise ResponseError("Transfer-Encoding with Content-Length")
        if not http11:
            raise ResponseError("Transfer-Encoding in an HTTP/1.0 response")
        return Head(status, content_type, keep_alive, None, True)
    if length is not None and length > limits.max_body:
        raise _too_large(limits)
    return Head(status, content_type, keep_alive and length is not None, length, False)


def _parse_fields(lines: list[bytes], limits: Limits) -> list[tuple[bytes, bytes]]:
    """Field lines as (lower-cased name, value without its surrounding whitespace), obs-folds unfolded."""
    if len(lines) > limits.max_fields:
        raise ResponseError(f"more than {limits.max_fields} field lines")
    fields: list[tuple[bytes, bytes]] = []
    for line in lines:
        if len(line) > limits.max_field_line:
            raise ResponseError(f"field line over {limits.max_field_line} bytes")
        match = _FIELD_LINE.fullmatch(line)
        if match is not None:
            fields.append((match[1].lower(), match[2].strip(b" \t")))
        elif fields and _FOLDED.fullmatch(line) is not None:
            name, value = fields[-1]
            fields[-1] = (name, (value + b" " + line.strip(b" \t")).strip(b" "))
        else:
            raise ResponseError(_bad_line("field line", line))
    return fields


def _tokens(value: bytes) -> list[bytes]:
    """A comma-separated list's elements, lower-cased; empty ones are skipped (RFC 9110 §5.6.1)."""
    return [item for item in (part.strip(b" \t").lower() for part in value.split(b",")) if item]
