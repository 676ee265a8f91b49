"""One HTTP/2 connection of the gRPC server on an asyncio transport: the sans-IO
:class:`~pointsman_picker.h2grpc.protocol.H2Protocol` fed from the socket, nothing more.

Each read is handed to the protocol whole and what it answered goes out in one ``transport.write``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import cast

from pointsman_picker.h2grpc.calls import Method
from pointsman_picker.h2grpc.protocol import H2Protocol


class H2Connection(asyncio.Protocol):
    def __init__(
        self,
        methods: Mapping[bytes, Method],
        *,
        max_message_bytes: int,
        on_close: Callable[[H2Connection], None],
        on_idle: Callable[[], None],
    ) -> None:
        self._on_close = on_close
        self._transport: asyncio.Transport | None = None
        # on_output: a method answering outside a read (later, from elsewhere) is written at once.
        self.protocol = H2Protocol(
            methods, max_message_bytes=max_message_bytes, on_idle=on_idle, on_output=self._flush
        )

    # -- what the server sees ---------------------------------------------------------------------
    @property
    def open_streams(self) -> int:
        return self.protocol.open_streams

    def go_away(self) -> None:
        """Refuse new streams and close once the open ones end (graceful shutdown)."""
        self.protocol.goaway()
        self._flush()

    def abort(self) -> None:
        """Cancel what is open and close now (shutdown's grace has run out)."""
        self.protocol.close()
        self._flush()

    # -- asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._flush()  # the server's preface

    def data_received(self, data: bytes) -> None:
        self.protocol.receive_data(data)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.protocol.connection_lost()
        self._on_close(self)

    def pause_writing(self) -> None:
        # The peer is not reading: stop reading its requests until it catches up.
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._transport is not None:
            self._transport.resume_reading()

    def _flush(self) -> None:
        transport = self._transport
        if transport is None:
            return  # not connected yet: the bytes wait in the protocol
        data = self.protocol.data_to_send()
        if data and not transport.is_closing():
            transport.write(data)
        if self.protocol.closing:
            transport.close()
