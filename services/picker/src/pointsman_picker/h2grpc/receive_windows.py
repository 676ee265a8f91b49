"""What the peer may still send one connection of the HTTP/2 server: the flow-control windows of the
receiving direction, when to return them (WINDOW_UPDATE), and the budget of request bytes held.

The connection's window (:data:`RECEIVE_WINDOW`) goes back as bytes are read: each is consumed,
dropped, or held within ``max_buffered_bytes``, so what the peer has of it is ``RECEIVE_WINDOW`` less
what was read and not yet returned; it is returned once half is due. A stream's window goes back only
as its messages are consumed (once half of it is due), and opens to a message's announced length when
that is larger, so a message bigger than the window can still arrive whole. h2 keeps the same
accounting in its ``WindowManager``; here one object holds the policy and the connection's counts,
and each stream's counts stay on the stream (no object per stream).

Sans I/O: the methods return the increment to announce (0: none), the protocol writes the frame.
"""

from __future__ import annotations

from typing import Protocol

from pointsman_picker.h2grpc.limits import Limits
from pointsman_picker.h2grpc.wire import ErrorCode, H2ConnectionError

RECEIVE_WINDOW = 16 * 1024 * 1024  # the connection's receive window
_HALF_RECEIVE_WINDOW = RECEIVE_WINDOW // 2


class ReceivingStream(Protocol):
    """What the windows read and keep on a stream."""

    recv_window: int  # what the peer may still send on the stream
    reserved: int  # the announced size of a message begun and not ended, counted in ``held``
    inbox: bytearray  # the part of that message read so far


class ReceiveWindows:
    """The receiving direction's windows of one connection, from its :class:`Limits`."""

    __slots__ = ("_half", "_max_buffered", "_unacked", "held", "initial")

    def __init__(self, limits: Limits) -> None:
        self.initial = limits.initial_window_size  # each stream's, as advertised in SETTINGS
        self._half = limits.initial_window_size // 2
        self._max_buffered = limits.max_buffered_bytes
        self._unacked = 0  # read, not yet returned to the connection window
        self.held = 0  # request bytes reserved by unfinished messages, over every stream

    def connection_read(self, size: int) -> int:
        """A DATA frame of ``size`` bytes (padding included) arrived: the increment to return to the
        connection's window now, or 0. Past the window is a connection error."""
        unacked = self._unacked + size
        if unacked >= _HALF_RECEIVE_WINDOW:
            if unacked > RECEIVE_WINDOW:
                raise H2ConnectionError("DATA past the connection's window", ErrorCode.FLOW_CONTROL_ERROR)
            self._unacked = 0
            return unacked
        self._unacked = unacked
        return 0

    @staticmethod
    def stream_read(stream: ReceivingStream, size: int) -> bool:
        """``size`` bytes arrived on ``stream``: False when that is past its window (a stream error)."""
        if size > stream.recv_window:
            return False
        stream.recv_window -= size
        return True

    def stream_grant(self, stream: ReceivingStream) -> int:
        """The stream is still open after a DATA frame: what to return to its window now (counted as
        returned), or 0. A stream holding part of a message may be opened past its window, so the
        rest of the message (however large) can come; otherwise what was consumed goes back once half
        the window is due."""
        inbox = stream.inbox
        if inbox:
            held = len(inbox)
            need = stream.reserved - held if stream.reserved else 0
            target = max(self.initial - held, need)
            grant = target - stream.recv_window
            if grant > 0 and (grant >= self._half or stream.recv_window < need):
                stream.recv_window += grant
                return grant
            return 0
        grant = self.initial - stream.recv_window
        if grant >= self._half:
            stream.recv_window += grant
            return grant
        return 0

    def hold(self, stream: ReceivingStream, pending: int) -> bool:
        """The stream now holds a message begun of ``pending`` bytes (0: none): counted, or False when
        that would pass ``max_buffered_bytes`` (one message alone always fits: the message cap bounds
        it)."""
        held = self.held + pending - stream.reserved
        if pending and held > self._max_buffered and held > pending:
            return False
        self.held = held
        stream.reserved = pending
        return True

    def release(self, stream: ReceivingStream) -> None:
        """The stream's unfinished message is dropped (or the stream is gone): its bytes are free."""
        if stream.reserved:
            self.held -= stream.reserved
            stream.reserved = 0
