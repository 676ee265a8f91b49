"""A minimal HTTP/1.1 GET client for scraping: one keep-alive connection per pod, an asyncio
BufferedProtocol.

Why not aiohttp or httpx: a scrape is one fixed GET to one host, 20 times a second, for hundreds of pods.
A protocol parsing one buffer costs less than asyncio streams (no future per read), which cost about
half of aiohttp per request; httpx cannot keep up at 4,000 requests/s.
What this supports is what a ``/metrics`` endpoint needs: Content-Length, chunked and read-until-close
bodies, ``Connection: close``, a cap on the body size and a deadline per request. It sends no
``Accept-Encoding``, so servers answer uncompressed. Its limits against h11's and httpx's defaults, and
the numbers behind it: docs/decisions/httpclient.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from pointsman_collector.errors import (
    ConnectError,
    FetchError,
    HttpProtocolError,
    HttpStatusError,
    ScrapeTimeout,
    TooLargeError,
)
from pointsman_shared.config import join_host_port

# vLLM pages are 15-80 KB; a page far larger is a misconfigured target, not a model server.
DEFAULT_MAX_BODY = 4 * 1024 * 1024
MAX_HEAD = 64 * 1024
MAX_CHUNK_LINE = 4096
# Each connection keeps its receive buffer (doubled when a response does not fit), so after the first
# scrape the socket reads straight into memory that is already there.
INITIAL_BUFFER = 64 * 1024
_HEAD_END = b"\r\n\r\n"
_CRLF = b"\r\n"


class _StaleConnection(Exception):
    """The server closed a kept-alive connection before answering; a fresh connection may succeed."""


Done = Callable[["Response | FetchError"], None]
Reply = Callable[["Response | FetchError | _StaleConnection"], None]


class HttpClient:
    """Repeated GETs of one path on one server, reusing one connection while the server allows it.

    Driven by callbacks: :meth:`start` sends a request and the answer is handed to a callback from the
    connection's data callback, with no task or future per request (a collector scrapes thousands of
    times a second). Any failure drops the connection, so the next request starts from a fresh one.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        path: str = "/metrics",
        timeout: float,
        max_body: int = DEFAULT_MAX_BODY,
    ) -> None:
        self._host = host
        self._port = port
        self._timeout = timeout
        self._max_body = max_body
        self._request = (
            f"GET {path} HTTP/1.1\r\nHost: {join_host_port(host, port)}\r\n"
            "User-Agent: pointsman-collector\r\nAccept: text/plain\r\n\r\n"
        ).encode("ascii")
        # Kept: asyncio.get_running_loop() makes a getpid() system call each time.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connection: _Connection | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._done: Done | None = None  # who gets the answer in flight, if any
        self._deadline = 0.0  # when that answer is due
        self._watchdog: asyncio.TimerHandle | None = None

    def start(self, done: Done) -> None:
        """Send a request; ``done`` gets the 200 response or a :class:`FetchError`, once.

        It may be called before ``start`` returns (a connection the server had already closed).
        One request at a time: the next ``start`` comes after ``done``.
        """
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        self._done = done
        self._deadline = loop.time() + self._timeout
        if self._watchdog is None:
            self._watchdog = loop.call_at(self._deadline, self._check_deadline)
        connection = self._connection
        if connection is not None and connection.open:
            connection.request(self._request, self._on_reply, reused=True)
        else:
            self._reconnect()

    async def aclose(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        self._done = None
        connecting, self._connecting = self._connecting, None
        if connecting is not None:
            connecting.cancel()
            await asyncio.gather(connecting, return_exceptions=True)  # its socket closed, if any
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
            await connection.wait_closed()

    def _reconnect(self) -> None:
        self._drop()
        assert self._loop is not None
        self._connecting = self._loop.create_task(self._connect())

    async def _connect(self) -> None:
        assert self._loop is not None
        try:
            _, connection = await self._loop.create_connection(
                lambda: _Connection(self._max_body), self._host, self._port
            )
        except OSError as exc:
            error = ConnectError(f"{join_host_port(self._host, self._port)}: {exc.strerror or exc}")
            self._connecting = None
            self._finish(error)
            return
        self._connecting = None
        self._connection = connection
        connection.request(self._request, self._on_reply, reused=False)

    def _on_reply(self, result: Response | FetchError | _StaleConnection) -> None:
        if isinstance(result, _StaleConnection):
            self._reconnect()  # the server closed a kept-alive connection: a fresh one may succeed
            return
        if isinstance(result, Response):
            if not result.keep_alive:
                connection, self._connection = self._connection, None
                if connection is not None:
                    connection.close()
        else:
            self._drop()  # the connection is mid-response or broken: never reuse it
        self._finish(result)

    def _finish(self, result: Response | FetchError) -> None:
        done, self._done = self._done, None
        if done is not None:
            done(result)

    def _check_deadline(self) -> None:
        """Fail the awaited response if it is overdue, else wait for its deadline.

        One timer serves many requests: set for an earlier request, it fires before the current one's
        deadline (deadlines only grow) and is set again for it, so a client scraping every 50 ms with a
        1 s timeout makes one timer a second, not twenty.
        """
        self._watchdog = None
        if self._done is None:
            return  # idle: the next request sets a timer
        assert self._loop is not None
        if self._loop.time() >= self._deadline:
            self._abandon_exchange()
            self._finish(ScrapeTimeout(f"no complete response within {self._timeout}s"))
        else:
            self._watchdog = self._loop.call_at(self._deadline, self._check_deadline)

    def _abandon_exchange(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
            self._connecting = None
        self._drop()

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.abort()  # a broken exchange has nothing worth flushing


@dataclass(frozen=True, slots=True)
class Response:
    body: bytes
    content_type: bytes | None  # as sent, lower-cased; None when the server sent none
    keep_alive: bool


class _Connection(asyncio.BufferedProtocol):
    """One TCP connection: sends a request and reads its response as the bytes arrive.

    A protocol instead of asyncio streams: the response is parsed straight from one buffer, with no
    per-read futures, which halves the cost of an exchange. A buffered protocol: the event loop reads
    into this connection's own buffer, so a 50 KB page is copied once (into the body) instead of four
    times (into a read's bytes, the growing buffer, a slice of it and the body), and the buffer is not
    allocated again for every response.
    """

    def __init__(self, max_body: int) -> None:
        self._max_body = max_body
        # What the receive buffer may hold: a head and a body, with room for the body's chunk framing.
        self._max_buffer = MAX_HEAD + 2 * max_body
        # Kept: asyncio.get_running_loop() makes a getpid() system call each time.
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray(INITIAL_BUFFER)
        self._view = memoryview(self._buffer)
        self._size = 0  # bytes of the buffer received; what lies beyond is left from earlier responses
        self._raw_head = b""  # the last head parsed, and what it said: servers repeat theirs
        self._parsed_head: _Head | None = None
        self._reply: Reply | None = None  # who gets the response being read, if any
        self._reused = False
        self._eof = False
        self._closed: asyncio.Future[None] | None = None
        self._head: _Head | None = None
        self._body_start = 0
        self._chunks: list[bytes] = []
        self._chunk_pos = 0  # where the next chunk-size line starts
        self._chunked_total = 0
        self.open = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        self._closed = self._loop.create_future()
        self.open = True

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._size == len(self._buffer):
            # A new buffer, not a resize: the event loop may still hold a view of the old one.
            self._buffer = bytearray(2 * len(self._buffer))
            self._buffer[: self._size] = self._view
            self._view = memoryview(self._buffer)
        return self._view[self._size :]

    def buffer_updated(self, nbytes: int) -> None:
        self._size += nbytes
        if self._size > self._max_buffer:
            # More than a response may take: bytes nobody asked for (on an idle connection, or after a
            # response), or a body in tiny chunks with long extensions. The buffer grows no further.
            self._fail(TooLargeError(self._max_body))
            self.abort()  # idle, no one to tell: the next request finds the connection closed
            return
        if self._reply is not None:
            self._advance()

    def eof_received(self) -> bool:
        self._eof = True
        self.open = False
        if self._reply is not None:
            self._advance()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self._eof = True
        if self._reply is not None:
            if exc is not None and not (self._reused and not self._size):
                self._fail(HttpProtocolError(f"connection failed: {_describe(exc)}"))
            else:
                self._advance()
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    # what the client calls

    def request(self, data: bytes, reply: Reply, *, reused: bool) -> None:
        """Send ``data``; ``reply`` gets the response, a :class:`FetchError` or :class:`_StaleConnection`."""
        assert self._transport is not None
        self._reply = reply
        self._reused = reused
        self._head = None
        self._chunks = []
        self._chunked_total = 0
        # The request is ~100 bytes: it never fills the transport buffer, so flow control is moot.
        self._transport.write(data)
        if self._size or self._eof:
            self._advance()  # the server sent something unasked, or had already hung up

    def abort(self) -> None:
        self.open = False
        self._reply = None
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        self.open = False
        self._reply = None
        if self._transport is not None:
            self._transport.close()

    async def wait_closed(self) -> None:
        if self._closed is not None:
            await self._closed

    # parsing

    def _advance(self) -> None:
        try:
            response = self._parse()
        except FetchError as exc:
            self._fail(exc)
            return
        except _StaleConnection as exc:
            self._fail(exc)
            return
        if response is not None:
            reply, self._reply = self._reply, None
            self._size = 0
            if reply is not None:
                reply(response)

    def _fail(self, exc: FetchError | _StaleConnection) -> None:
        reply, self._reply = self._reply, None
        self.open = False
        if reply is not None:
            reply(exc)

    def _parse(self) -> Response | None:
        size = self._size
        head = self._head
        if head is None:
            end = self._buffer.find(_HEAD_END, 0, size)
            if end < 0:
                if size > MAX_HEAD:
                    raise HttpProtocolError("response head too large")
                if self._eof:
                    if self._reused and not size:
                        raise _StaleConnection
                    raise HttpProtocolError("connection closed before the response head ended")
                return None
            raw = bytes(self._view[: end + 4])
            if raw != self._raw_head or self._parsed_head is None:
                self._raw_head, self._parsed_head = raw, _parse_head(raw)
            head = self._head = self._parsed_head
            if head.status != 200:
                raise HttpStatusError(head.status)
            if head.length is not None and head.length > self._max_body:
                raise TooLargeError(self._max_body)
            self._body_start = self._chunk_pos = end + 4
        if head.chunked:
            return self._parse_chunked(head)
        if head.length is not None:
            if size - self._body_start >= head.length:
                body = bytes(self._view[self._body_start : self._body_start + head.length])
                return Response(body, head.content_type, head.keep_alive)
        elif size - self._body_start > self._max_body:
            raise TooLargeError(self._max_body)
        elif self._eof:
            return Response(bytes(self._view[self._body_start : size]), head.content_type, keep_alive=False)
        if self._eof:
            raise HttpProtocolError("connection closed mid-body")
        return None

    def _parse_chunked(self, head: _Head) -> Response | None:
        buffer = self._buffer
        filled = self._size
        pos = self._chunk_pos
        while True:
            line_end = buffer.find(_CRLF, pos, filled)
            if line_end < 0:
                if filled - pos > MAX_CHUNK_LINE:
                    raise HttpProtocolError("chunk header too long")
                break
            size_line = bytes(buffer[pos:line_end])
            try:
                size = int(size_line.split(b";", 1)[0], 16)  # a chunk extension may follow ';'
            except ValueError:
                raise HttpProtocolError(f"bad chunk size line {size_line[:40]!r}") from None
            if size < 0:
                raise HttpProtocolError("negative chunk size")
            if size == 0:
                # Trailer fields (nothing here needs them) end with an empty line.
                if (
                    buffer.startswith(_CRLF, line_end + 2, filled)
                    or buffer.find(_HEAD_END, line_end, filled) >= 0
                ):
                    body = b"".join(self._chunks)
                    return Response(body, head.content_type, head.keep_alive)
                break
            self._chunked_total += size
            if self._chunked_total > self._max_body:
                raise TooLargeError(self._max_body)
            data_end = line_end + 2 + size
            if filled < data_end + 2:
                self._chunked_total -= size  # counted again when the chunk is complete
                break
            if buffer[data_end : data_end + 2] != _CRLF:
                raise HttpProtocolError("chunk not followed by CRLF")
            self._chunks.append(bytes(self._view[line_end + 2 : data_end]))
            pos = data_end + 2
        self._chunk_pos = pos
        if self._eof:
            raise HttpProtocolError("connection closed mid-body")
        return None


@dataclass(frozen=True, slots=True)
class _Head:
    status: int
    length: int | None
    chunked: bool
    keep_alive: bool
    content_type: bytes | None


def _describe(exc: BaseException) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc) or type(exc).__name__


def _parse_head(head: bytes) -> _Head:
    lines = head[:-4].split(_CRLF)
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0") or not parts[1].isdigit():
        raise HttpProtocolError(f"bad status line {lines[0][:60]!r}")
    keep_alive = parts[0] == b"HTTP/1.1"
    length: int | None = None
    coding: bytes | None = None
    content_type: bytes | None = None
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise HttpProtocolError(f"bad header line {line[:60]!r}")
        name = name.strip().lower()
        if name == b"content-length":
            value = value.strip()
            if not value.isdigit() or (length is not None and int(value) != length):
                raise HttpProtocolError(f"bad Content-Length {value[:20]!r}")  # or one unlike the one before
            length = int(value)
        elif name == b"content-type":
            content_type = value.strip().lower()
        elif name == b"transfer-encoding":
            coding = value.strip().lower()
        elif name == b"connection":
            tokens = value.lower()
            if b"close" in tokens:
                keep_alive = False
            elif b"keep-alive" in tokens:
                keep_alive = True
    # RFC 9112 §6.3: Transfer-Encoding overrides Content-Length; a body whose last coding is not
    # chunked runs until the connection closes.
    chunked = coding is not None and coding.endswith(b"chunked")
    if coding is not None:
        length = None
    return _Head(int(parts[1]), length, chunked, keep_alive, content_type)
