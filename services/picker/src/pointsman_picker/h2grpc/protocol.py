"""The server side of one HTTP/2 connection carrying gRPC calls, sans I/O.

Bytes read from the peer go in through :meth:`H2Protocol.receive_data`; the bytes to write come out of
:meth:`H2Protocol.data_to_send`; when :attr:`H2Protocol.closing` turns true the transport should be
closed once those are written. The socket loop is someone else's (``connection.py`` for asyncio; the
tests replay bytes), as with python-hyper/h2's ``H2Connection``. There are no timers: the clock is
given, and the asyncio side calls :meth:`H2Protocol.handshake_timed_out` or :meth:`H2Protocol.goaway`
when its timers run out.

Calls are synchronous: a method's :class:`~pointsman_picker.h2grpc.calls.Call` gets each request
message as soon as its last byte is read and answers through its ``ServerStream`` in place, so a
message costs no task, no future and no thread hop, and everything answered while one read is handled
comes out of one ``data_to_send``.

The connection composes three objects, as h2 composes its windows and settings (each limit in
:class:`~pointsman_picker.h2grpc.limits.Limits`):

- :class:`~pointsman_picker.h2grpc.receive_windows.ReceiveWindows`: the receiving direction's
  flow-control windows, when they are returned, and the request bytes held in unfinished messages;
- :class:`~pointsman_picker.h2grpc.send_scheduler.SendScheduler`: the responses queued per stream
  against the peer's windows and frame size, which streams wait on which window, and the cap on
  what waits for a peer that grants no window;
- :class:`~pointsman_picker.h2grpc.budgets.FloodBudgets`: token buckets for resets, PINGs, SETTINGS
  and empty frames (GOAWAY ENHANCE_YOUR_CALM past them), and the caps on header-block bytes,
  CONTINUATION frames and settings per frame.

This class keeps the frames' reading and dispatch, the streams and their ends, the header decoder
and RFC 9113's connection and stream errors; the limits advertised in SETTINGS (concurrent streams,
header list size) enforced; at most ``max_streams_per_read`` new streams per turn
(:attr:`H2Protocol.backlog` tells the caller to come back). A connection error is GOAWAY with its
code; an unexpected exception is GOAWAY INTERNAL_ERROR and a logged traceback.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from pointsman_picker.h2grpc import wire
from pointsman_picker.h2grpc.budgets import FloodBudgets
from pointsman_picker.h2grpc.calls import Call, Method, Status
from pointsman_picker.h2grpc.limits import Limits
from pointsman_picker.h2grpc.receive_windows import RECEIVE_WINDOW, ReceiveWindows
from pointsman_picker.h2grpc.send_scheduler import SendScheduler
from pointsman_picker.h2grpc.wire import (
    ACK,
    END_HEADERS,
    END_STREAM,
    PRIORITY,
    ErrorCode,
    FrameType,
    H2ConnectionError,
    Setting,
)

log = logging.getLogger(__name__)

MAX_FRAME = 1024 * 1024  # what this side accepts; the peer's own limit caps what it sends
_CONNECTION_SPECIFIC = frozenset(
    {b"connection", b"proxy-connection", b"keep-alive", b"transfer-encoding", b"upgrade"}
)
_MESSAGE_PATH = 200  # of an unknown method's path, echoed in its grpc-message
# The longest answer a stream keeps framed for its next send: the constants sent per token are a few
# bytes; a routed request's answer (its body) is neither sent twice nor worth holding for the stream.
_CACHED_ANSWER = 256


class _Unexpected(Exception):
    """A bug met while handling a frame of ``stream_id``: the connection ends with INTERNAL_ERROR."""

    def __init__(self, stream_id: int) -> None:
        super().__init__(stream_id)
        self.stream_id = stream_id


class _Stream:
    """One call's HTTP/2 stream; its response side is the method's ``ServerStream``."""

    __slots__ = (
        "answer",
        "call",
        "connection",
        "finished",
        "headers_sent",
        "id",
        "inbox",
        "metadata",
        "outbox",
        "queued",
        "recv_window",
        "remote_closed",
        "reserved",
        "send_delta",
        "trailers",
    )

    def __init__(self, connection: H2Protocol, stream_id: int) -> None:
        self.connection = connection
        self.id = stream_id
        self.call: Call | None = None
        self.metadata: Sequence[tuple[bytes, bytes]] = ()  # the request's header fields
        self.inbox = bytearray()  # a request message not yet complete
        self.reserved = 0  # the announced size of that message, counted in the connection's budget
        self.recv_window = connection._receiving.initial  # what the peer may still send on this stream
        self.outbox: deque[bytes] = deque()  # response bytes waiting for flow-control window
        self.queued = 0  # their size
        # The stream's send window is the peer's initial window plus this: a SETTINGS change of the
        # initial window then moves every stream's at once without visiting any.
        self.send_delta = 0
        self.headers_sent = False
        self.trailers: bytes | None = None  # waiting behind the outbox
        self.remote_closed = False  # the peer ended its side (END_STREAM)
        self.finished = False
        # (payload, its gRPC message, its DATA frame) of the last short answer: a method that answers
        # every message with the same bytes object (a constant) has it framed once.
        self.answer: tuple[bytes, bytes, bytes] | None = None

    def send(self, payload: bytes) -> None:
        if self.finished:
            return
        connection = self.connection
        if not self.headers_sent:
            self.headers_sent = True
            connection._write(wire.frame(FrameType.HEADERS, END_HEADERS, self.id, wire.RESPONSE_HEADERS))
        answer = self.answer
        if answer is not None and answer[0] is payload:
            message, framed = answer[1], answer[2]
        else:
            message, framed = wire.grpc_message(payload), b""
            if len(payload) <= _CACHED_ANSWER:
                framed = wire.frame(FrameType.DATA, 0, self.id, message)
                self.answer = (payload, message, framed)
        if connection._sending.send(self, message, framed):
            connection._queued_too_much()
        if not connection._reading:
            connection._output_waiting()

    def finish(self, status: Status = Status.OK, message: str = "") -> None:
        if self.finished:
            return
        self.finished = True
        connection = self.connection
        if not self.headers_sent:
            block = wire.trailers_only(status, message)
        else:
            block = wire.trailers(status, message)
        self.trailers = wire.frame(FrameType.HEADERS, END_HEADERS | END_STREAM, self.id, block)
        connection._drain(self)
        if not connection._reading:
            connection._output_waiting()


class H2Protocol:
    """One HTTP/2 server connection's state: its streams, the header decoder, the shutdown state and
    the bytes waiting to be written; its receive windows, send scheduling and flood budgets.

    ``on_idle`` is told whenever the last open stream ends (the server's shutdown waits on it).
    ``on_output`` is told when a method answers outside :meth:`receive_data` (a call answered later):
    the answer is then waiting in :meth:`data_to_send`. Inside ``receive_data`` nobody is told: the
    caller collects everything once the read is handled. ``clock`` (seconds, monotonic) is read only
    when a budgeted frame arrives.
    """

    def __init__(
        self,
        methods: Mapping[bytes, Method],
        *,
        max_message_bytes: int,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_idle: Callable[[], None] | None = None,
        on_output: Callable[[], None] | None = None,
    ) -> None:
        limits = limits or Limits()
        # Fewer than 30 attributes (28 now): past 29, CPython 3.11 reads each of them more slowly
        # (measured with bench/h2_cost.py: 30 cost 5.6% more instructions per unary call, 29 nothing).
        # State of its own belongs in the objects composed below.
        self._methods = methods
        self._max_message = max_message_bytes
        self._limits = limits
        self._on_idle = on_idle
        self._on_output = on_output
        self._buffer = bytearray()  # the start of a frame not yet complete
        self._preface_seen = False
        self._handle = self._first_frame  # then self._frame, once the client's SETTINGS came
        self._decoder = wire.HeaderDecoder(max_list_size=limits.max_header_list_size)
        self._streams: dict[int, _Stream] = {}
        self._last_stream_id = 0
        self.streams_started = 0
        """Streams this connection has opened, ever (the asyncio side tells idleness by it)."""
        # Streams this side reset, newest last: frames the peer sent before it saw the reset are dropped.
        self._reset_sent: dict[int, None] = {}
        self._reset_memory = max(256, 2 * limits.max_concurrent_streams)
        self._max_streams = limits.max_concurrent_streams
        # (stream, flags, block, depends on itself) of a HEADERS frame whose CONTINUATIONs are due
        self._header_block: tuple[int, int, bytearray, bool] | None = None
        self._checked: tuple[list[tuple[bytes, bytes]], bytes] = ([], b"")  # a field list found well-formed
        self._turn_left = limits.max_streams_per_read
        self.backlog = False
        """Frames were left unread for the other connections' sake: call ``receive_data(b"")`` again."""
        self._out: list[bytes] = []
        self._reading = False  # inside receive_data: nobody needs telling about output
        # stream -> index in _out of trailers not yet handed out, so a reset right behind the
        # half-close can take them back.
        self._trailers_at: dict[int, int] = {}
        self._receiving = ReceiveWindows(limits)
        self._sending: SendScheduler[_Stream] = SendScheduler(
            self._write, max_queued_bytes=limits.max_queued_bytes
        )
        self._budgets = FloodBudgets(limits, clock)
        self._going_away = False
        self._peer_goaway = False
        self.closing = False
        """The connection is over: write what :meth:`data_to_send` gives, then close the transport."""
        # The server's connection preface.
        self._write(
            wire.settings_frame(
                {
                    Setting.ENABLE_PUSH: 0,
                    Setting.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
                    Setting.INITIAL_WINDOW_SIZE: limits.initial_window_size,
                    Setting.MAX_FRAME_SIZE: MAX_FRAME,
                    Setting.MAX_HEADER_LIST_SIZE: limits.max_header_list_size,
                }
            )
        )
        self._write(wire.window_update(0, RECEIVE_WINDOW - wire.DEFAULT_WINDOW))

    # -- the API ----------------------------------------------------------------------------------
    @property
    def open_streams(self) -> int:
        return len(self._streams)

    @property
    def handshake_done(self) -> bool:
        """The client's preface and first SETTINGS have been read."""
        return self._handle != self._first_frame

    @property
    def buffered_bytes(self) -> int:
        """Request bytes this connection holds: unfinished messages, a partial frame, a header block."""
        block = self._header_block
        return (
            sum(len(stream.inbox) for stream in self._streams.values())
            + len(self._buffer)
            + (len(block[2]) if block is not None else 0)
        )

    @property
    def queued_bytes(self) -> int:
        """Response bytes waiting for the peer's flow-control window, and written but not handed out."""
        return self._sending.queued + sum(len(data) for data in self._out)

    def receive_data(self, data: bytes) -> None:
        """Handle bytes read from the peer: frames are acted on and complete messages handed to their
        methods before this returns (up to ``max_streams_per_read`` new streams: then :attr:`backlog`
        is set and the rest waits for the next call). A peer breaking HTTP/2 gets GOAWAY, and the
        connection closes."""
        if self.closing:
            return  # what a closed transport would have dropped
        self._reading = True
        self._turn_left = self._limits.max_streams_per_read
        try:
            self._receive(data)
        except H2ConnectionError as exc:
            self._fail(exc)
        except _Unexpected as exc:
            log.error(
                "HTTP/2 connection: unexpected error on stream %d", exc.stream_id, exc_info=exc.__cause__
            )
            self._fail(H2ConnectionError("internal error", ErrorCode.INTERNAL_ERROR))
        finally:
            self._reading = False

    def data_to_send(self) -> bytes:
        """What to write to the peer now, in order (empty when nothing is due)."""
        if self._trailers_at:
            self._trailers_at.clear()  # handed out: too late to take back
        out = self._out
        if not out:
            return b""
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        return data

    def goaway(self) -> None:
        """Refuse new streams and close once the open ones end (graceful shutdown, or the connection's
        age)."""
        if self._going_away or self.closing:
            return
        self._going_away = True
        self._write(wire.goaway(self._last_stream_id, ErrorCode.NO_ERROR))
        self._close_if_idle()

    def handshake_timed_out(self, seconds: float) -> None:
        """The client's preface and SETTINGS did not arrive within ``seconds``: GOAWAY, close."""
        if not self.handshake_done:
            self._fail(H2ConnectionError(f"no client preface and SETTINGS within {seconds:g}s"))

    def close(self) -> None:
        """Cancel what is open and close now (shutdown's grace has run out, or the peer broke HTTP/2)."""
        for stream in list(self._streams.values()):
            self._write(wire.rst_stream(stream.id, ErrorCode.CANCEL))
            self._end(stream, cancelled=True)
        self.closing = True
        self._turn_left = 0
        self.backlog = False
        self._header_block = None
        self._buffer.clear()

    def connection_lost(self) -> None:
        """The transport is gone: every open call is cancelled."""
        self.closing = True
        self._turn_left = 0
        self.backlog = False
        for stream in list(self._streams.values()):
            self._end(stream, cancelled=True)

    # -- reading ----------------------------------------------------------------------------------
    def _receive(self, data: bytes) -> None:
        buffer = self._buffer
        view: bytes | bytearray = data
        if buffer or not self._preface_seen:
            # Only a frame split across reads is copied into the buffer; whole frames are cut from
            # the read itself.
            buffer += data
            view = buffer
        at = 0
        if not self._preface_seen:
            if len(buffer) < len(wire.PREFACE):
                if not wire.PREFACE.startswith(bytes(buffer)):
                    raise H2ConnectionError("not an HTTP/2 client preface")
                return
            if not buffer.startswith(wire.PREFACE):
                raise H2ConnectionError("not an HTTP/2 client preface")
            self._preface_seen = True
            at = len(wire.PREFACE)
        end = len(view)
        stream_id = 0
        streams = self._streams
        unpack = wire.unpack_frame_header
        try:
            while self._turn_left > 0 and end - at >= wire.FRAME_HEADER_BYTES:
                high, low, kind, flags, stream_id = unpack(view, at)
                length = high << 16 | low
                stream_id &= wire.MAX_WINDOW
                if length > MAX_FRAME:
                    raise H2ConnectionError(f"frame of {length} bytes", ErrorCode.FRAME_SIZE_ERROR)
                start = at + wire.FRAME_HEADER_BYTES
                if end - start < length:
                    break
                at = start + length
                # The common frame (a streamed response's token): DATA holding one whole message on an
                # open stream, handed to its call without a copy of the frame or the frame handlers.
                if (
                    not kind
                    and not flags
                    and (stream := streams.get(stream_id)) is not None
                    and self._whole_message(stream, view, start, at)
                ):
                    continue
                self._handle(kind, flags, stream_id, bytes(view[start:at]))
        except H2ConnectionError:
            raise
        except Exception as exc:
            raise _Unexpected(stream_id) from exc
        self.backlog = self._turn_left <= 0 and not self.closing and end - at >= wire.FRAME_HEADER_BYTES
        if view is buffer:
            del buffer[:at]
        elif at < end:
            buffer += view[at:]

    def _first_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        # RFC 9113 §3.4: the preface's SETTINGS frame is the client's first.
        if kind != FrameType.SETTINGS or flags & ACK:
            raise H2ConnectionError("the client's first frame is not SETTINGS")
        self._handle = self._frame
        self._frame(kind, flags, stream_id, payload)

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._header_block is not None and kind != FrameType.CONTINUATION:
            raise H2ConnectionError("a header block was interrupted")
        if kind == FrameType.DATA:
            self._data(flags, stream_id, payload)
        elif kind == FrameType.HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == FrameType.RST_STREAM:
            self._rst_stream(stream_id, payload)
        elif kind == FrameType.WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == FrameType.CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == FrameType.SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == FrameType.PING:
            if stream_id:
                raise H2ConnectionError("PING on a stream")
            if len(payload) != 8:
                raise H2ConnectionError("PING of the wrong length", ErrorCode.FRAME_SIZE_ERROR)
            if flags & ACK:
                self._budgets.empty()  # this side sends none
            else:
                self._budgets.ping()
                self._write(wire.frame(FrameType.PING, ACK, 0, payload))
        elif kind == FrameType.GOAWAY:
            if stream_id:
                raise H2ConnectionError("GOAWAY on a stream")
            if len(payload) < 8:
                raise H2ConnectionError("GOAWAY too short", ErrorCode.FRAME_SIZE_ERROR)
            if self._peer_goaway:
                self._budgets.empty()
            self._peer_goaway = self._going_away = True
            self._close_if_idle()
        elif kind == FrameType.PUSH_PROMISE:
            raise H2ConnectionError("a client may not push")
        elif kind == FrameType.PRIORITY:
            self._priority(stream_id, payload)
        else:  # unknown frame types are ignored, as RFC 9113 §4.1 asks, and counted
            self._budgets.empty()

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise H2ConnectionError("DATA on stream 0")
        size = len(payload)
        # Every byte read is consumed, dropped or held within max_buffered_bytes: the connection's
        # window goes back at once; the stream's only as its messages are consumed.
        receiving = self._receiving
        increment = receiving.connection_read(size)
        if increment:
            self._write(wire.window_update(0, increment))
        stream = self._streams.get(stream_id)
        if stream is None:
            self._data_on_closed(stream_id)
            return
        if stream.remote_closed:  # RFC 9113 §5.1 half-closed (remote)
            self._stream_error(stream_id, ErrorCode.STREAM_CLOSED, "DATA after END_STREAM")
            return
        if not receiving.stream_read(stream, size):
            self._stream_error(stream_id, ErrorCode.FLOW_CONTROL_ERROR, "DATA past the stream's window")
            return
        if not size and not flags & END_STREAM:
            self._budgets.empty()
        if flags & wire.PADDED:
            payload = wire.unpad(payload, flags)
        if payload:
            self._messages(stream, payload)
        if flags & END_STREAM:
            # Unless a message just refused closed (and reset) the stream from this side.
            if not stream.remote_closed:
                self._remote_closed(stream)
        elif not stream.finished:
            grant = receiving.stream_grant(stream)
            if grant:
                self._write(wire.window_update(stream.id, grant))

    def _whole_message(self, stream: _Stream, view: bytes | bytearray, start: int, end: int) -> bool:
        """A DATA frame without flags at ``view[start:end]`` on ``stream``: when it holds exactly one
        uncompressed message within the limits and the windows, on a stream with nothing pending, it
        is handled as :meth:`_data` would handle it and True is returned; else False, with nothing
        changed (the frame then goes the whole way)."""
        length = end - start
        if length < 5:
            return False
        compressed, size = wire.unpack_grpc_prefix(view, start)
        receiving = self._receiving
        if (
            compressed
            or size != length - 5
            or size > self._max_message
            or stream.remote_closed
            or stream.finished
            or stream.inbox
            or stream.reserved
            or self._header_block is not None
            or stream.call is None
            or not receiving.stream_read(stream, length)  # last: it takes the frame off the window
        ):
            return False
        increment = receiving.connection_read(length)
        if increment:
            self._write(wire.window_update(0, increment))
        self._dispatch(stream, bytes(view[start + 5 : end]))
        if not stream.finished:
            grant = receiving.stream_grant(stream)
            if grant:
                self._write(wire.window_update(stream.id, grant))
        return True

    def _data_on_closed(self, stream_id: int) -> None:
        if self._is_idle(stream_id):
            raise H2ConnectionError(f"DATA on idle stream {stream_id}")
        if stream_id not in self._reset_sent:  # else sent before the peer saw this side's reset
            self._stream_error(stream_id, ErrorCode.STREAM_CLOSED, "DATA on a closed stream")

    def _messages(self, stream: _Stream, payload: bytes) -> None:
        if stream.finished:
            return  # answered already (its trailers wait for window): the rest is not read
        inbox = stream.inbox
        if inbox:
            inbox += payload
            data: bytes | bytearray = inbox
        else:
            data = payload
            # The common case, a frame holding one whole message: handed on without the loop below.
            compressed, length = wire.grpc_prefix(data, 0) if len(data) >= 5 else (1, 0)
            if (
                length + 5 == len(data)
                and not compressed
                and length <= self._max_message
                and not stream.reserved
            ):
                self._dispatch(stream, data[5:])
                if stream.finished:
                    self._receiving.release(stream)
                return
        at, end = 0, len(data)
        pending = 0  # the size of a message begun and not ended
        while end - at >= 5:
            compressed, length = wire.grpc_prefix(data, at)
            if length > self._max_message:
                self._refuse(
                    stream, Status.RESOURCE_EXHAUSTED, f"message larger than {self._max_message} bytes"
                )
                return
            if end - at - 5 < length:
                pending = 5 + length
                break
            if compressed:
                self._refuse(stream, Status.UNIMPLEMENTED, "compressed messages are not supported")
                return
            message = bytes(data[at + 5 : at + 5 + length])
            at += 5 + length
            self._dispatch(stream, message)
            if stream.finished:
                inbox.clear()
                self._receiving.release(stream)
                return
        if pending != stream.reserved and not self._receiving.hold(stream, pending):
            self._refuse(
                stream,
                Status.RESOURCE_EXHAUSTED,
                f"the connection holds {self._receiving.held} bytes of unfinished messages"
                f" (limit {self._limits.max_buffered_bytes})",
            )
            return
        if data is inbox:
            del inbox[:at]
        elif at < end:
            inbox += data[at:]

    def _dispatch(self, stream: _Stream, message: bytes) -> None:
        assert stream.call is not None
        try:
            stream.call.message(message)
        except Exception:
            log.exception("gRPC method failed on stream %d", stream.id)
            self._refuse(stream, Status.INTERNAL, "internal error")

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise H2ConnectionError("HEADERS on stream 0")
        payload = wire.unpad(payload, flags)
        self_dependent = False
        if flags & PRIORITY:
            if len(payload) < 5:
                raise H2ConnectionError("HEADERS too short for its priority", ErrorCode.FRAME_SIZE_ERROR)
            self_dependent = wire.u32(payload) & wire.MAX_WINDOW == stream_id
            payload = payload[5:]
        budgets = self._budgets
        if len(payload) > budgets.max_block:
            raise budgets.block_too_large(len(payload))
        if flags & END_HEADERS:
            self._header_block_done(stream_id, flags, payload, self_dependent)
        else:
            if not payload:
                budgets.empty()
            self._header_block = (stream_id, flags, bytearray(payload), self_dependent)
            budgets.block_started()

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        pending = self._header_block
        if pending is None or pending[0] != stream_id:
            raise H2ConnectionError("CONTINUATION without its HEADERS")
        budgets = self._budgets
        budgets.continuation()
        if not payload and not flags & END_HEADERS:
            budgets.empty()
        block = pending[2]
        budgets.header_block(len(block) + len(payload))
        block += payload
        if flags & END_HEADERS:
            self._header_block = None
            self._header_block_done(stream_id, pending[1], bytes(block), pending[3])

    def _header_block_done(self, stream_id: int, flags: int, block: bytes, self_dependent: bool) -> None:
        decoder = self._decoder
        fields = decoder.decode(block)  # always: the table must follow every block
        stream = self._streams.get(stream_id)
        if stream is not None:  # the client's trailers
            if stream.remote_closed:
                self._stream_error(stream_id, ErrorCode.STREAM_CLOSED, "HEADERS after END_STREAM")
            elif not flags & END_STREAM or decoder.malformed or any(name[:1] == b":" for name, _ in fields):
                self._stream_error(stream_id, ErrorCode.PROTOCOL_ERROR, "malformed trailers")
            else:
                self._remote_closed(stream)
            return
        if stream_id <= self._last_stream_id:
            if stream_id in self._reset_sent:
                return  # trailers the client sent before it saw this side's reset
            raise H2ConnectionError(f"HEADERS on stream {stream_id}, not above {self._last_stream_id}")
        if stream_id % 2 == 0:
            raise H2ConnectionError("a client stream id must be odd")
        self._last_stream_id = stream_id
        self.streams_started += 1
        if self._going_away:
            self._refuse_stream(stream_id)
            return
        if len(self._streams) >= self._max_streams:
            self._refuse_stream(stream_id)
            self._budgets.reset()
            return
        self._turn_left -= 1
        if decoder.oversized:
            stream = self._open(stream_id)
            stream.remote_closed = bool(flags & END_STREAM)
            stream.finish(
                Status.RESOURCE_EXHAUSTED,
                f"header list larger than {self._limits.max_header_list_size} bytes",
            )
            return
        if fields is self._checked[0]:  # the decoder's cached block: checked already
            path, problem = self._checked[1], None
        else:
            path, problem = _request_problem(fields)
            problem = problem or decoder.malformed
            if problem is None:
                self._checked = (fields, path)
        if self_dependent:
            problem = "depends on itself"
        if problem is not None:
            self._stream_error(stream_id, ErrorCode.PROTOCOL_ERROR, f"malformed request: {problem}")
            return
        method = self._methods.get(path)
        stream = self._open(stream_id)
        stream.metadata = fields
        if method is None:
            stream.remote_closed = bool(flags & END_STREAM)
            stream.finish(Status.UNIMPLEMENTED, f"unknown method {path[:_MESSAGE_PATH].decode('latin-1')}")
            return
        try:
            stream.call = method(stream)
        except Exception:
            log.exception("gRPC method %s failed to start", path.decode("latin-1"))
            stream.finish(Status.INTERNAL, "internal error")
            return
        if flags & END_STREAM:
            self._remote_closed(stream)

    def _open(self, stream_id: int) -> _Stream:
        stream = _Stream(self, stream_id)
        self._streams[stream_id] = stream
        return stream

    def _refuse_stream(self, stream_id: int) -> None:
        """RST_STREAM REFUSED_STREAM: nothing of the stream was processed, the client may retry it."""
        self._write(wire.rst_stream(stream_id, ErrorCode.REFUSED_STREAM))
        self._remember_reset(stream_id)

    def _remote_closed(self, stream: _Stream) -> None:
        stream.remote_closed = True
        if stream.finished:
            self._close_if_done(stream)
            return
        if stream.inbox:
            self._refuse(stream, Status.INTERNAL, "the request ended inside a message")
            return
        assert stream.call is not None
        try:
            stream.call.half_closed()
        except Exception:
            log.exception("gRPC method failed on stream %d", stream.id)
            self._refuse(stream, Status.INTERNAL, "internal error")

    def _rst_stream(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2ConnectionError("RST_STREAM of the wrong length", ErrorCode.FRAME_SIZE_ERROR)
        if not stream_id:
            raise H2ConnectionError("RST_STREAM on stream 0")
        stream = self._streams.get(stream_id)
        if stream is not None:
            answered = stream.headers_sent
            self._end(stream, cancelled=True)
            # Rapid reset opens streams and resets them before they are answered: work thrown away. A
            # stream this side has answered on is the client done with it (Envoy resets its ext_proc
            # streams when the exchange ends, hundreds a second at load): not counted.
            if not answered:
                self._budgets.reset()
        elif stream_id in self._trailers_at:
            # Envoy ends each ext_proc stream with END_STREAM and RST_STREAM in one write: the
            # trailers answering the first are not wanted; not sending them spares a write and a
            # wake-up on both sides.
            self._out[self._trailers_at.pop(stream_id)] = b""
        elif self._is_idle(stream_id):
            raise H2ConnectionError(f"RST_STREAM on idle stream {stream_id}")

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2ConnectionError("WINDOW_UPDATE of the wrong length", ErrorCode.FRAME_SIZE_ERROR)
        increment = wire.u32(payload) & wire.MAX_WINDOW
        if not stream_id:
            if not increment:
                raise H2ConnectionError("WINDOW_UPDATE of 0 on the connection")
            for waiting in self._sending.grow_connection(increment):
                self._drain(waiting)
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            if self._is_idle(stream_id):
                raise H2ConnectionError(f"WINDOW_UPDATE on idle stream {stream_id}")
            return  # a closed stream: the peer had not seen it close
        if not increment:
            self._stream_error(stream_id, ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            return
        sending = self._sending
        if not sending.grow_stream(stream, increment):
            self._stream_error(stream_id, ErrorCode.FLOW_CONTROL_ERROR, "stream window overflow")
            return
        if sending.unblock(stream):
            self._drain(stream)

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise H2ConnectionError("SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise H2ConnectionError("SETTINGS acknowledgement with a payload", ErrorCode.FRAME_SIZE_ERROR)
            self._budgets.settings_ack()
            return
        self._budgets.settings(len(payload))
        sending = self._sending
        grew = False
        for key, value in wire.parse_settings(payload):
            if key == Setting.INITIAL_WINDOW_SIZE:
                grew = sending.set_initial_window(value, self._streams.values()) or grew
            elif key == Setting.MAX_FRAME_SIZE:
                sending.set_max_frame(value)
            elif key == Setting.ENABLE_PUSH and value > 1:
                raise H2ConnectionError("bad ENABLE_PUSH")
        self._write(wire.frame(FrameType.SETTINGS, ACK, 0))
        if grew:
            for stream in sending.take_stream_blocked():
                self._drain(stream)

    def _priority(self, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise H2ConnectionError("PRIORITY on stream 0")
        self._budgets.empty()
        if stream_id not in self._streams:
            return  # idle or closed: nothing to reset (RFC 9113 §6.3 allows PRIORITY on any)
        if len(payload) != 5:
            self._stream_error(stream_id, ErrorCode.FRAME_SIZE_ERROR, "PRIORITY of the wrong length")
        elif wire.u32(payload) & wire.MAX_WINDOW == stream_id:
            self._stream_error(stream_id, ErrorCode.PROTOCOL_ERROR, "a stream depends on itself")

    def _is_idle(self, stream_id: int) -> bool:
        """Never opened: above the last client stream, or one this server would have had to open."""
        return stream_id > self._last_stream_id or not stream_id & 1

    def _stream_error(self, stream_id: int, code: ErrorCode, reason: str) -> None:
        """RFC 9113 §5.4.2: RST_STREAM with ``code``; the call, if any, is cancelled. Counted with the
        client's resets: a client that makes this side reset streams works it as rapid reset does."""
        log.debug("HTTP/2 stream error on stream %d (%s): %s", stream_id, code.name, reason)
        self._write(wire.rst_stream(stream_id, code))
        stream = self._streams.get(stream_id)
        if stream is not None:
            self._end(stream, cancelled=True)
        self._remember_reset(stream_id)
        self._budgets.reset()

    def _remember_reset(self, stream_id: int) -> None:
        reset = self._reset_sent
        if len(reset) >= self._reset_memory:
            del reset[next(iter(reset))]
        reset[stream_id] = None

    def _fail(self, exc: H2ConnectionError) -> None:
        """A connection error (RFC 9113 §5.4.1): GOAWAY with its code, then close."""
        if self.closing:
            return
        log.warning("HTTP/2 connection error (%s): %s", exc.code.name, exc)
        self._write(wire.goaway(self._last_stream_id, exc.code, str(exc).encode()[:256]))
        self.close()

    # -- writing ----------------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        if not self.closing:  # past the close, as a closing transport would, nothing more goes out
            self._out.append(data)

    def _queued_too_much(self) -> None:
        self._fail(
            H2ConnectionError(
                f"{self._sending.queued} response bytes wait for window from a peer that does not grant it",
                ErrorCode.ENHANCE_YOUR_CALM,
            )
        )

    def _output_waiting(self) -> None:
        if self._out and self._on_output is not None:
            self._on_output()

    def _drain(self, stream: _Stream) -> None:
        """Send what the windows allow of the stream's responses, then its trailers."""
        if not self._sending.drain(stream):
            return
        if stream.trailers is not None:
            if not self.closing:
                self._trailers_at[stream.id] = len(self._out)
            self._write(stream.trailers)
            stream.trailers = None
            if not stream.remote_closed:
                # The call is over: tell the client to stop sending (as gRPC servers do).
                self._write(wire.rst_stream(stream.id, ErrorCode.NO_ERROR))
                self._remember_reset(stream.id)
                stream.remote_closed = True
            self._close_if_done(stream)

    def _refuse(self, stream: _Stream, status: Status, message: str) -> None:
        """End a call this side cannot go on with; the method hears it as cancelled."""
        stream.inbox.clear()
        self._receiving.release(stream)
        call, stream.call = stream.call, None
        stream.finish(status, message)
        if call is not None:
            _cancel(call, stream.id)

    def _close_if_done(self, stream: _Stream) -> None:
        done = stream.finished and stream.remote_closed and stream.trailers is None and not stream.outbox
        if done and self._streams.pop(stream.id, None) is not None:
            if stream.reserved:
                self._receiving.release(stream)
            self._close_if_idle()

    def _end(self, stream: _Stream, *, cancelled: bool) -> None:
        if self._streams.pop(stream.id, None) is None:
            return
        stream.finished = stream.remote_closed = True
        self._sending.forget(stream)
        stream.trailers = None
        stream.inbox.clear()
        self._receiving.release(stream)
        call, stream.call = stream.call, None
        if cancelled and call is not None:
            _cancel(call, stream.id)
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        if self._streams:
            return
        if self._on_idle is not None:
            self._on_idle()
        if self._going_away:
            self.closing = True
            self._turn_left = 0


def _cancel(call: Call, stream_id: int) -> None:
    try:
        call.cancelled()
    except Exception:
        log.exception("gRPC method failed on stream %d", stream_id)


def _request_problem(fields: list[tuple[bytes, bytes]]) -> tuple[bytes, str | None]:
    """The request's :path, and why its header fields make it malformed (RFC 9113 §8.2-8.3), or None."""
    path: bytes | None = None
    method = scheme = authority = regular = False
    for name, value in fields:
        if name[:1] == b":":
            if regular:
                return b"", "a pseudo-header after a regular field"
            if name == b":path":
                if path is not None or not value:
                    return b"", "a second or empty :path"
                path = value
            elif name == b":method":
                if method:
                    return b"", "a second :method"
                method = True
            elif name == b":scheme":
                if scheme:
                    return b"", "a second :scheme"
                scheme = True
            elif name == b":authority" and not authority:
                authority = True
            else:
                return b"", f"pseudo-header {name[:32]!r}"
        else:
            regular = True
            if name in _CONNECTION_SPECIFIC:
                return b"", f"connection-specific field {name!r}"
            if name == b"te" and value != b"trailers":
                return b"", "te other than trailers"
    if path is None or not method or not scheme:
        return b"", "no :method, :scheme or :path"
    return path, None
