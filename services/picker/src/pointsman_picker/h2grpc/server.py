"""A gRPC server over plain HTTP/2 (h2c), for methods that answer synchronously.

Why not grpcio: behind Envoy every request is one ext_proc stream of two or more messages, and
grpc.aio spends 400-500 µs of CPU per stream in its own machinery (measured: docs/picker.md, "Speed").
This server feeds each connection's reads to a sans-IO HTTP/2 protocol (``protocol.py``, on asyncio
through ``connection.py``), which calls the method in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from pointsman_picker.h2grpc.calls import Method
from pointsman_picker.h2grpc.connection import H2Connection
from pointsman_shared import aio

log = logging.getLogger(__name__)


class GrpcServer:
    def __init__(self, methods: Mapping[str, Method], *, max_message_bytes: int) -> None:
        self._methods = {path.encode(): method for path, method in methods.items()}
        self._max_message = max_message_bytes
        self._connections: set[H2Connection] = set()
        self._server: asyncio.Server | None = None
        self._drained = asyncio.Event()

    @property
    def open_streams(self) -> int:
        return sum(connection.open_streams for connection in self._connections)

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (port 0: a free one); the port bound."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._connection, host or None, port, reuse_address=True)
        return int(self._server.sockets[0].getsockname()[1])

    def _connection(self) -> H2Connection:
        connection = H2Connection(
            self._methods,
            max_message_bytes=self._max_message,
            on_close=self._closed,
            on_idle=self._idle,
        )
        self._connections.add(connection)
        return connection

    def _closed(self, connection: H2Connection) -> None:
        self._connections.discard(connection)
        self._idle()

    def _idle(self) -> None:
        if not self.open_streams:
            self._drained.set()

    async def stop(self, grace: float | None) -> None:
        """Stop accepting, tell every client to go away, let open calls end within ``grace`` seconds,
        then cancel the rest."""
        if self._server is None:
            return
        self._server.close()
        for connection in list(self._connections):
            connection.go_away()
        self._drained.clear()
        self._idle()
        await aio.wait_event(self._drained, grace or 0.0)
        for connection in list(self._connections):
            connection.abort()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await self._server.wait_closed()
        self._server = None
