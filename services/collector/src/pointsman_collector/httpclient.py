"""A minimal HTTP/1.1 GET client for scraping: one keep-alive connection per pod, an asyncio
BufferedProtocol driving the sans-IO parser of :mod:`pointsman_collector.http1`.

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
from typing import cast

from pointsman_collector.errors import (
    ConnectError,
    FetchError,
    HttpProtocolError,
    HttpStatusError,
    ScrapeTimeout,
    TooLargeError,
)
from pointsman_collector.http1 import CLOSED, NEED_DATA, Head, Limits, Response, ResponseError, ResponseParser
from pointsman_shared.config import join_host_port

DEFAULT_MAX_BODY = Limits().max_body
# Each connection's parser keeps its receive buffer (doubled when a response does not fit), so after the
# first scrape the socket reads straight into memory that is already there.
INITIAL_BUFFER = 64 * 1024


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
        self._limits = Limits(max_body=max_body)
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
                lambda: _Connection(self._limits), self._host, self._port
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


class _Connection(asyncio.BufferedProtocol):
    """One TCP connection: sends a request and hands its bytes to a sans-IO parser as they arrive.

    A protocol instead of asyncio streams: no per-read futures, which halves the cost of an exchange.
    A buffered protocol: the event loop reads into the parser's own buffer, so a 50 KB page is copied
    once (into the body) instead of four times (into a read's bytes, a growing buffer, a slice of it
    and the body), and the buffer is not allocated again for every response.
    """

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._parser = ResponseParser(limits, initial_buffer=INITIAL_BUFFER)
        # Kept: asyncio.get_running_loop() makes a getpid() system call each time.
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._reply: Reply | None = None  # who gets the response being read, if any
        self._reused = False
        self._closed: asyncio.Future[None] | None = None
        self.open = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        self._closed = self._loop.create_future()
        self.open = True

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._parser.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self._parser.buffer_updated(nbytes)
        if self._reply is not None:
            self._advance()
        else:
            # Bytes nobody asked for, on an idle connection: they would be read as the next answer.
            self.abort()

    def eof_received(self) -> bool:
        self._parser.receive_eof()
        self.open = False
        if self._reply is not None:
            self._advance()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self._reply is not None:
            if exc is not None and not (self._reused and self._parser.between_responses):
                self._fail(HttpProtocolError(f"connection failed: {_describe(exc)}"))
            else:
                self._parser.receive_eof()
                self._advance()
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    # what the client calls

    def request(self, data: bytes, reply: Reply, *, reused: bool) -> None:
        """Send ``data``; ``reply`` gets the response, a :class:`FetchError` or :class:`_StaleConnection`."""
        assert self._transport is not None
        self._reply = reply
        self._reused = reused
        # The request is ~100 bytes: it never fills the transport buffer, so flow control is moot.
        self._transport.write(data)

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

    # reading

    def _advance(self) -> None:
        parser = self._parser
        try:
            event = parser.next_event()
            if isinstance(event, Head):
                if event.status != 200:
                    self._fail(HttpStatusError(event.status))
                    return
                event = parser.next_event()
        except ResponseError as exc:
            self._fail(self._fetch_error(exc))
            return
        if event is NEED_DATA:
            return
        if event is CLOSED:
            self._fail(
                _StaleConnection()
                if self._reused
                else HttpProtocolError("connection closed before the response head ended")
            )
            return
        assert isinstance(event, Response)
        reply, self._reply = self._reply, None
        if parser.buffered:
            self.close()  # bytes after the answer, unasked: the next answer could not be told from them
        if reply is not None:
            reply(event)

    def _fetch_error(self, exc: ResponseError) -> FetchError:
        """The parser's one error as the collector's: the body's size is a reason of its own."""
        return TooLargeError(self._limits.max_body) if exc.too_large else HttpProtocolError(exc.detail)

    def _fail(self, exc: FetchError | _StaleConnection) -> None:
        reply, self._reply = self._reply, None
        self.open = False
        if reply is not None:
            reply(exc)


def _describe(exc: BaseException) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc) or type(exc).__name__
