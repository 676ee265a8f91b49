"""What one connection of the HTTP/2 server sends, against the peer's windows: the response bytes
queued per stream, the connection's and each stream's send window, the peer's frame size, and which
streams wait on which window.

A stream's response messages go out as DATA frames while both windows allow, cut to the peer's frame
size; what does not fit waits in the stream's outbox, counted against ``max_queued_bytes`` (a peer
that grants no window must not make this side hold its answers without end). Streams waiting on the
connection's window and those waiting on their own are kept apart, so a WINDOW_UPDATE or a SETTINGS
change visits only the streams it can move: a connection-level update is shared out in the order the
streams began to wait, and one that must wait again goes to the back. A stream's window is the
peer's initial window plus the stream's ``send_delta``, so a SETTINGS change of the initial window
moves every stream's at once without visiting any. As in h2's ``H2Connection``, the frames are
written through the protocol's ``write``.

Sans I/O; what a stream does once its outbox is empty (its trailers) is the protocol's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, Protocol, TypeVar

from pointsman_picker.h2grpc import wire
from pointsman_picker.h2grpc.wire import ErrorCode, FrameType, H2ConnectionError


class SendingStream(Protocol):
    """What the scheduler reads and keeps on a stream."""

    id: int
    outbox: deque[bytes]  # response bytes waiting for window, oldest first
    queued: int  # their size, once counted against max_queued_bytes
    send_delta: int  # the stream's send window less the peer's initial window


S = TypeVar("S", bound=SendingStream)


class SendScheduler(Generic[S]):
    """The sending direction of one connection: ``write`` takes each DATA frame, in order."""

    __slots__ = (
        "_conn_blocked",
        "_max_delta",
        "_max_queued",
        "_stream_blocked",
        "_write",
        "max_frame",
        "peer_initial",
        "queued",
        "window",
    )

    def __init__(self, write: Callable[[bytes], None], *, max_queued_bytes: int) -> None:
        self._write = write
        self._max_queued = max_queued_bytes
        self.peer_initial = wire.DEFAULT_WINDOW  # the peer's initial stream window
        self.max_frame = wire.DEFAULT_MAX_FRAME  # the peer's
        self.window = wire.DEFAULT_WINDOW  # the connection's send window
        self._max_delta = 0  # at least every open stream's send_delta (exact when it matters)
        self._conn_blocked: dict[int, S] = {}  # streams with window of their own, waiting on the connection's
        self._stream_blocked: dict[int, S] = {}  # streams waiting on their own window
        self.queued = 0  # response bytes in the streams' outboxes, counted

    def send(self, stream: S, message: bytes, framed: bytes = b"") -> bool:
        """Send ``message`` on ``stream`` as far as the windows allow; True when more bytes wait than
        ``max_queued_bytes`` (the peer does not read: the connection should end). ``framed``, when
        given, is ``message`` as one DATA frame of ``stream``, written as it is if it fits."""
        outbox = stream.outbox
        if not outbox:
            # The common case, an answer that fits both windows and one frame: written at once.
            size = len(message)
            if (
                size <= self.peer_initial + stream.send_delta
                and size <= self.window
                and size <= self.max_frame
            ):
                stream.send_delta -= size
                self.window -= size
                self._write(framed or wire.frame(FrameType.DATA, 0, stream.id, message))
                return False
        outbox.append(message)
        if len(outbox) > 1:  # waiting for window already: this waits behind
            stream.queued += len(message)
            self.queued += len(message)
        else:
            self.drain(stream)
            if not outbox:
                return False
            left = sum(len(chunk) for chunk in outbox)  # the windows ran out: what is left waits, counted
            stream.queued = left
            self.queued += left
        return self.queued > self._max_queued

    def drain(self, stream: S) -> bool:
        """Send what the windows allow of the stream's outbox; True when it is empty."""
        outbox = stream.outbox
        write = self._write
        while outbox:
            window = self.peer_initial + stream.send_delta
            if window <= 0:
                self._stream_blocked[stream.id] = stream
                return False
            if window > self.window:
                window = self.window
                if window <= 0:
                    self._conn_blocked[stream.id] = stream
                    return False
            chunk = outbox[0]
            size = min(len(chunk), window, self.max_frame)
            if size < len(chunk):
                outbox[0] = chunk[size:]
                chunk = chunk[:size]
            else:
                outbox.popleft()
            stream.send_delta -= size
            self.window -= size
            if stream.queued:
                stream.queued -= size
                self.queued -= size
            write(wire.frame(FrameType.DATA, 0, stream.id, chunk))
        return True

    def grow_connection(self, increment: int) -> Iterator[S]:
        """A WINDOW_UPDATE of the connection: the streams it lets go on, each to be drained before the
        next is asked for (the window is shared out in the order they began to wait)."""
        self.window += increment
        if self.window > wire.MAX_WINDOW:
            raise H2ConnectionError("connection window overflow", ErrorCode.FLOW_CONTROL_ERROR)
        return self._conn_unblocked()

    def _conn_unblocked(self) -> Iterator[S]:
        blocked = self._conn_blocked
        while blocked and self.window > 0:
            yield blocked.pop(next(iter(blocked)))

    def grow_stream(self, stream: S, increment: int) -> bool:
        """A WINDOW_UPDATE of ``stream``'s window: False when it overflows (a stream error)."""
        stream.send_delta += increment
        if self.peer_initial + stream.send_delta > wire.MAX_WINDOW:
            return False
        if stream.send_delta > self._max_delta:
            self._max_delta = stream.send_delta
        return True

    def unblock(self, stream: S) -> bool:
        """The stream's own window grew: True when it was waiting on it (it should be drained)."""
        return self._stream_blocked.pop(stream.id, None) is not None

    def set_initial_window(self, value: int, streams: Iterable[S]) -> bool:
        """The peer's SETTINGS_INITIAL_WINDOW_SIZE: True when it grew. ``streams`` gives the open
        streams, walked only when a stream window might overflow."""
        if value > wire.MAX_WINDOW:
            raise H2ConnectionError("initial window too large", ErrorCode.FLOW_CONTROL_ERROR)
        if value + self._max_delta > wire.MAX_WINDOW:
            # Rare: find the exact largest stream window before calling it an overflow.
            self._max_delta = max((s.send_delta for s in streams), default=0)
            if value + self._max_delta > wire.MAX_WINDOW:
                raise H2ConnectionError("a stream window overflows", ErrorCode.FLOW_CONTROL_ERROR)
        grew = value > self.peer_initial
        self.peer_initial = value
        return grew

    def set_max_frame(self, value: int) -> None:
        """The peer's SETTINGS_MAX_FRAME_SIZE."""
        if not wire.DEFAULT_MAX_FRAME <= value <= 2**24 - 1:
            raise H2ConnectionError("bad MAX_FRAME_SIZE")
        self.max_frame = value

    def take_stream_blocked(self) -> Iterator[S]:
        """The streams waiting on their own window (after the initial window grew): every one is let
        go, to be drained."""
        if not self._stream_blocked:
            return iter(())
        blocked, self._stream_blocked = self._stream_blocked, {}
        return iter(blocked.values())

    def forget(self, stream: S) -> None:
        """The stream is gone: what it had queued is dropped."""
        self._conn_blocked.pop(stream.id, None)
        self._stream_blocked.pop(stream.id, None)
        self.queued -= stream.queued
        stream.queued = 0
        stream.outbox.clear()
