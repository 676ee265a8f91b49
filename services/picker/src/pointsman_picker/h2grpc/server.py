"""A gRPC server over plain HTTP/2 (h2c), for methods that answer synchronously.

Why not grpcio: behind Envoy every request is one ext_proc stream of two or more messages, and
grpc.aio spends 400-500 µs of CPU per stream in its own machinery (measured: docs/picker.md, "Speed").
This server feeds each connection's reads to a sans-IO HTTP/2 protocol (``protocol.py``, on asyncio
through ``connection.py``), which calls the method in place.

Each connection's limits and timers come from ``picker.http2`` (:func:`limits_of`); the server itself
holds at most ``maxConnections``: one more gets the server's SETTINGS and GOAWAY, and is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Mapping
from typing import cast

from pointsman_picker.h2grpc import wire
from pointsman_picker.h2grpc.calls import Method
from pointsman_picker.h2grpc.config import Http2Budget, Http2Config
from pointsman_picker.h2grpc.connection import H2Connection
from pointsman_picker.h2grpc.limits import Limits, Rate, Timeouts
from pointsman_shared import aio

log = logging.getLogger(__name__)

_REFUSAL_LOG_EVERY = 10.0  # seconds between warnings about refused connections


def limits_of(config: Http2Config) -> tuple[Limits, Timeouts]:
    """``picker.http2`` as the protocol's limits and the connection's timers."""

    def rate(budget: Http2Budget) -> Rate:
        return Rate(budget.burst, budget.per_second)

    limits = Limits(
        max_concurrent_streams=config.max_concurrent_streams,
        max_header_list_size=config.max_header_list_size,
        initial_window_size=config.initial_window_size,
        max_buffered_bytes=config.max_buffered_bytes,
        max_queued_bytes=config.max_queued_bytes,
        max_streams_per_read=config.max_streams_per_read,
        resets=rate(config.resets),
        pings=rate(config.pings),
        settings=rate(config.settings),
        empty_frames=rate(config.empty_frames),
    )
    timeouts = Timeouts(
        handshake=config.handshake_timeout,
        idle=config.idle_timeout,
        max_age=config.max_connection_age,
        age_grace=config.max_connection_age_grace,
    )
    return limits, timeouts


class _Refused(asyncio.Protocol):
    """A connection past ``maxConnections``: the server's SETTINGS, GOAWAY (no stream processed), close."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        writer = cast(asyncio.Transport, transport)
        writer.write(
            wire.settings_frame({}) + wire.goaway(0, wire.ErrorCode.NO_ERROR, b"too many connections")
        )
        writer.close()


class GrpcServer:
    def __init__(
        self,
        methods: Mapping[str, Method],
        *,
        max_message_bytes: int,
        http2: Http2Config | None = None,
        rng: random.Random | None = None,
    ) -> None:
        config = http2 or Http2Config()
        self._methods = {path.encode(): method for path, method in methods.items()}
        self._max_message = max_message_bytes
        self._limits, self._timeouts = limits_of(config)
        self._max_connections = config.max_connections
        self._rng = rng or random.Random()
        self._connections: set[H2Connection] = set()
        self._server: asyncio.Server | None = None
        self._drained = asyncio.Event()
        self.refused_connections = 0
        self._refusal_logged = -_REFUSAL_LOG_EVERY

    @property
    def open_streams(self) -> int:
        return sum(connection.open_streams for connection in self._connections)

    @property
    def connections(self) -> int:
        return len(self._connections)

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (port 0: a free one); the port bound."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._connection, host or None, port, reuse_address=True)
        return int(self._server.sockets[0].getsockname()[1])

    def _connection(self) -> asyncio.Protocol:
        if len(self._connections) >= self._max_connections:
            self.refused_connections += 1
            now = time.monotonic()
            if now - self._refusal_logged >= _REFUSAL_LOG_EVERY:
                self._refusal_logged = now
                log.warning(
                    "ext_proc server: %d connections open, refusing more (%d refused so far)",
                    len(self._connections),
                    self.refused_connections,
                )
            return _Refused()
        connection = H2Connection(
            self._methods,
            max_message_bytes=self._max_message,
            on_close=self._closed,
            on_idle=self._idle,
            limits=self._limits,
            timeouts=self._timeouts,
            rng=self._rng,
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
