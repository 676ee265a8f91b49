"""One HTTP/2 connection of the gRPC server on an asyncio transport: the sans-IO
:class:`~pointsman_picker.h2grpc.protocol.H2Protocol` fed from the socket, and the connection's timers.

Each read is handed to the protocol whole and what it answered goes out in one ``transport.write``.
When the protocol leaves frames for later (:attr:`~H2Protocol.backlog`: too many new streams in one
read), reading pauses and the rest is handled on the loop's next turn, so other connections get theirs.

The timers (:class:`~pointsman_picker.h2grpc.limits.Timeouts`): the client's preface and SETTINGS
within ``handshake``; GOAWAY once no stream has been open for ``idle`` (checked every quarter of it);
GOAWAY at ``max_age`` (±10%, so connections made together do not all go at once), then, after
``age_grace``, the open calls cancelled. What each means on the wire is the protocol's decision.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping
from typing import cast

from pointsman_picker.h2grpc.calls import Method
from pointsman_picker.h2grpc.limits import NO_TIMERS, Limits, Timeouts
from pointsman_picker.h2grpc.protocol import H2Protocol

log = logging.getLogger(__name__)


class H2Connection(asyncio.Protocol):
    def __init__(
        self,
        methods: Mapping[bytes, Method],
        *,
        max_message_bytes: int,
        on_close: Callable[[H2Connection], None],
        on_idle: Callable[[], None],
        limits: Limits | None = None,
        timeouts: Timeouts | None = None,  # None: no timers (the server always gives them)
        rng: random.Random | None = None,
    ) -> None:
        self._on_close = on_close
        self._transport: asyncio.Transport | None = None
        self._timeouts = timeouts or NO_TIMERS
        self._rng = rng or random.Random()
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._age_timer: asyncio.TimerHandle | None = None
        self._write_paused = False
        self._backlog_due = False
        self._idle_seen = -1  # streams_started at the last idle check
        self._idle_for = 0.0
        # on_output: a method answering outside a read (later, from elsewhere) is written at once.
        self.protocol = H2Protocol(
            methods,
            max_message_bytes=max_message_bytes,
            limits=limits,
            on_idle=on_idle,
            on_output=self._flush,
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
        timeouts = self._timeouts
        if timeouts == NO_TIMERS:
            return
        loop = asyncio.get_running_loop()
        if timeouts.handshake is not None:
            self._handshake_timer = loop.call_later(timeouts.handshake, self._handshake_expired)
        if timeouts.idle is not None:
            self._idle_timer = loop.call_later(timeouts.idle / 4, self._idle_check)
        if timeouts.max_age is not None:
            age = timeouts.max_age * self._rng.uniform(0.9, 1.1)
            self._age_timer = loop.call_later(age, self._too_old)

    def data_received(self, data: bytes) -> None:
        protocol = self.protocol
        protocol.receive_data(data)
        if self._handshake_timer is not None and protocol.handshake_done:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        if protocol.backlog:
            self._later()
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._handshake_timer, self._idle_timer, self._age_timer):
            if timer is not None:
                timer.cancel()
        self._handshake_timer = self._idle_timer = self._age_timer = None
        self.protocol.connection_lost()
        self._on_close(self)

    def pause_writing(self) -> None:
        # The peer is not reading: stop reading its requests until it catches up.
        self._write_paused = True
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self.protocol.backlog:
            self._later()
        elif self._transport is not None and not self._backlog_due:
            self._transport.resume_reading()

    # -- the backlog --------------------------------------------------------------------------------
    def _later(self) -> None:
        """Frames wait in the protocol: stop reading, and handle them on the loop's next turn."""
        if self._backlog_due or self._transport is None:
            return
        self._backlog_due = True
        self._transport.pause_reading()
        asyncio.get_running_loop().call_soon(self._work_backlog)

    def _work_backlog(self) -> None:
        self._backlog_due = False
        if self._write_paused or self._transport is None or self._transport.is_closing():
            return  # resume_writing comes back for it
        self.protocol.receive_data(b"")
        if self.protocol.backlog:
            self._later()
        else:
            self._transport.resume_reading()
        self._flush()

    # -- timers -------------------------------------------------------------------------------------
    def _handshake_expired(self) -> None:
        self._handshake_timer = None
        seconds = self._timeouts.handshake or 0.0
        self.protocol.handshake_timed_out(seconds)
        self._flush()

    def _idle_check(self) -> None:
        self._idle_timer = None
        protocol = self.protocol
        if protocol.closing:
            return
        idle = self._timeouts.idle or 0.0
        if protocol.open_streams or protocol.streams_started != self._idle_seen:
            self._idle_seen = protocol.streams_started
            self._idle_for = 0.0
        else:
            self._idle_for += idle / 4
            if self._idle_for >= idle:
                log.debug("HTTP/2 connection idle for %gs: GOAWAY", idle)
                self.go_away()
                return
        self._idle_timer = asyncio.get_running_loop().call_later(idle / 4, self._idle_check)

    def _too_old(self) -> None:
        log.debug("HTTP/2 connection reached its max age: GOAWAY")
        self.go_away()
        grace = self._timeouts.age_grace
        self._age_timer = None
        if grace is not None and not self.protocol.closing:
            self._age_timer = asyncio.get_running_loop().call_later(grace, self.abort)

    def _flush(self) -> None:
        transport = self._transport
        if transport is None:
            return  # not connected yet: the bytes wait in the protocol
        data = self.protocol.data_to_send()
        if data and not transport.is_closing():
            transport.write(data)
        if self.protocol.closing:
            transport.close()
