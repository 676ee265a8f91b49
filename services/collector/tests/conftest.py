"""Fakes the collector's tests share: model-server pods on real sockets, a sink in memory, fixture pages."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pointsman_collector.errors import PublishError
from pointsman_shared.snapshot import PoolSnapshot

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "tests" / "data" / "vllm-metrics"


@pytest.fixture
def fixture_page() -> Callable[[str], str]:
    """The text of a fixture page of shared/tests/data/vllm-metrics, by name."""
    return lambda name: (FIXTURES / f"{name}.txt").read_text()


@dataclass
class Reply:
    """How a :class:`PodServer` answers each request."""

    body: bytes = b""
    status: int = 200
    chunk_size: int = 0  # > 0: send the body chunked, in pieces of this size
    delay: float = 0.0  # wait this long before answering
    close: bool = False  # announce "Connection: close" and close after the reply
    unframed: bool = False  # no Content-Length, no chunking: the body ends when the connection closes
    hang_up: bool = False  # close after the reply without announcing it (an idle keep-alive timeout)
    reset: bool = False  # reset the connection instead of answering
    raw: bytes | None = None  # send these bytes verbatim, then close
    content_type: str | None = "text/plain; version=0.0.4"  # None: send no Content-Type

    def render(self) -> bytes:
        if self.raw is not None:
            return self.raw
        head = [f"HTTP/1.1 {self.status} X"]
        if self.content_type is not None:
            head.append(f"Content-Type: {self.content_type}")
        if self.close:
            head.append("Connection: close")
        if self.chunk_size:
            head.append("Transfer-Encoding: chunked")
            size = self.chunk_size
            pieces = [self.body[i : i + size] for i in range(0, len(self.body), size)]
            body = (
                b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\nX-Trailer: 1\r\n\r\n"
            )
        else:
            if not self.unframed:
                head.append(f"Content-Length: {len(self.body)}")
            body = self.body
        return ("\r\n".join(head) + "\r\n\r\n").encode() + body

    @property
    def ends_connection(self) -> bool:
        return self.close or self.unframed or self.hang_up or self.raw is not None


@dataclass
class PodServer:
    """A fake model-server pod on a free loopback port, answering every request with ``reply``."""

    reply: Reply = field(default_factory=Reply)
    connections: int = 0
    requests: int = 0
    _server: asyncio.Server | None = None
    _handlers: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def address(self) -> str:
        assert self._server is not None
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    @property
    def open_connections(self) -> int:
        return len(self._handlers)

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def serve(self, page: str | bytes, **reply: object) -> None:
        body = page.encode() if isinstance(page, str) else page
        self.reply = Reply(body=body, **reply)  # type: ignore[arg-type]

    async def start(self) -> PodServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.connections += 1
        try:
            while True:
                try:
                    await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                self.requests += 1
                reply = self.reply
                if reply.delay:
                    await asyncio.sleep(reply.delay)
                if reply.reset:
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return
                writer.write(reply.render())
                await writer.drain()
                if reply.ends_connection:
                    return
        finally:
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()
            self._handlers.discard(task)


StartPod = Callable[..., Awaitable[PodServer]]


@pytest.fixture
async def pod_server() -> AsyncIterator[StartPod]:
    """Start fake pods: ``await pod_server(page, **reply)``; all are closed after the test."""
    servers: list[PodServer] = []

    async def start(page: str | bytes = b"", **reply: object) -> PodServer:
        server = PodServer()
        server.serve(page, **reply)
        servers.append(await server.start())
        return server

    yield start
    for server in servers:
        await server.aclose()


class MemorySink:
    """A :class:`~pointsman_collector.sink.SnapshotSink` in memory; set ``fail`` to a reason to fail."""

    def __init__(self) -> None:
        self.published: list[PoolSnapshot] = []
        self.fail: str | None = None
        self.changed = asyncio.Event()

    async def publish(self, pool: PoolSnapshot) -> int:
        if self.fail is not None:
            raise PublishError(self.fail, "injected")
        self.published.append(pool)
        self.changed.set()
        return len(self.published)

    async def wait_for(self, predicate: Callable[[PoolSnapshot], bool]) -> PoolSnapshot:
        """The first publish from now on that satisfies ``predicate`` (within 3 s)."""
        seen = len(self.published)
        async with asyncio.timeout(3.0):
            while True:
                for pool in self.published[seen:]:
                    if predicate(pool):
                        return pool
                seen = len(self.published)
                self.changed.clear()
                await self.changed.wait()


@pytest.fixture
def memory_sink() -> MemorySink:
    return MemorySink()


class TcpProxy:
    """Forwards a loopback port to a server; :meth:`cut` drops every connection and refuses new ones.

    Stands in for a network outage between the collector and Redis, without stopping the shared Redis.
    """

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            self._writers.discard(writer)
            return
        self._writers.add(up_writer)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        except OSError:
            pass
        finally:
            sink.transport.abort()
            self._writers.discard(sink)


@pytest.fixture
async def redis_proxy(redis_url: str) -> AsyncIterator[tuple[TcpProxy, str]]:
    """A proxy to the test Redis and the URL through it."""
    host_port = redis_url.split("://", 1)[1].split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    proxy = await TcpProxy(host, int(port)).start()
    yield proxy, f"redis://127.0.0.1:{proxy.port}/0"
    await proxy.cut()
