"""The server side of one HTTP/2 connection carrying gRPC calls, sans I/O.

Bytes read from the peer go in through :meth:`H2Protocol.receive_data`; the bytes to write come out of
:meth:`H2Protocol.data_to_send`; when :attr:`H2Protocol.closing` turns true the transport should be
closed once those are written. The socket loop is someone else's (``connection.py`` for asyncio; the
tests replay bytes), as with python-hyper/h2's ``H2Connection``. There are no timers: shutdown's grace
is the server's.

Calls are synchronous: a method's :class:`~pointsman_picker.h2grpc.calls.Call` gets each request
message as soon as its last byte is read and answers through its ``ServerStream`` in place, so a
message costs no task, no future and no thread hop, and everything answered while one read is handled
comes out of one ``data_to_send``.

Flow control: this side advertises large windows and returns what it reads right away (messages are
capped, not the window); what it sends waits for the peer's stream and connection windows and is cut
to the peer's frame size.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping

from pointsman_picker.h2grpc import wire
from pointsman_picker.h2grpc.calls import Call, Method, Status
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

RECEIVE_WINDOW = 16 * 1024 * 1024
MAX_FRAME = 1024 * 1024  # what this side accepts; the peer's own limit caps what it sends


class _Stream:
    """One call's HTTP/2 stream; its response side is the method's ``ServerStream``."""

    __slots__ = (
        "call",
        "connection",
        "finished",
        "headers_sent",
        "id",
        "inbox",
        "outbox",
        "remote_closed",
        "send_window",
        "trailers",
        "unacked",
    )

    def __init__(self, connection: H2Protocol, stream_id: int, send_window: int) -> None:
        self.connection = connection
        self.id = stream_id
        self.call: Call | None = None
        self.inbox = bytearray()  # a request message not yet complete
        self.outbox: deque[bytes] = deque()  # response bytes waiting for flow-control window
        self.send_window = send_window
        self.unacked = 0  # bytes read and not yet returned to the peer's stream window
        self.headers_sent = False
        self.trailers: bytes | None = None  # waiting behind the outbox
        self.remote_closed = False
        self.finished = False

    def send(self, payload: bytes) -> None:
        if self.finished:
            return
        connection = self.connection
        if not self.headers_sent:
            self.headers_sent = True
            connection._write(wire.frame(FrameType.HEADERS, END_HEADERS, self.id, wire.RESPONSE_HEADERS))
        self.outbox.append(wire.grpc_message(payload))
        connection._drain(self)
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
    """One HTTP/2 server connection's state: its streams, both flow-control directions, the header
    decoder, the shutdown state, and the bytes waiting to be written.

    ``on_idle`` is told whenever the last open stream ends (the server's shutdown waits on it).
    ``on_output`` is told when a method answers outside :meth:`receive_data` (a call answered later):
    the answer is then waiting in :meth:`data_to_send`. Inside ``receive_data`` nobody is told: the
    caller collects everything once the read is handled.
    """

    def __init__(
        self,
        methods: Mapping[bytes, Method],
        *,
        max_message_bytes: int,
        on_idle: Callable[[], None] | None = None,
        on_output: Callable[[], None] | None = None,
    ) -> None:
        self._methods = methods
        self._max_message = max_message_bytes
        self._on_idle = on_idle
        self._on_output = on_output
        self._buffer = bytearray()  # the start of a frame not yet complete
        self._preface_seen = False
        self._decoder = wire.HeaderDecoder()
        self._streams: dict[int, _Stream] = {}
        self._last_stream_id = 0
        self._peer_window = wire.DEFAULT_WINDOW  # the peer's initial stream window
        self._peer_max_frame = wire.DEFAULT_MAX_FRAME
        self._send_window = wire.DEFAULT_WINDOW  # the connection's
        self._unacked = 0  # read, not yet returned to the connection window
        self._header_block: tuple[int, int, bytearray] | None = None  # (stream, flags, block) of HEADERS
        self._out: list[bytes] = []
        self._reading = False  # inside receive_data: nobody needs telling about output
        # stream -> index in _out of trailers not yet handed out, so a reset right behind the
        # half-close can take them back.
        self._trailers_at: dict[int, int] = {}
        self._going_away = False
        self.closing = False
        """The connection is over: write what :meth:`data_to_send` gives, then close the transport."""
        # The server's connection preface.
        self._write(
            wire.settings_frame(
                {
                    Setting.ENABLE_PUSH: 0,
                    Setting.INITIAL_WINDOW_SIZE: RECEIVE_WINDOW,
                    Setting.MAX_FRAME_SIZE: MAX_FRAME,
                }
            )
        )
        self._write(wire.window_update(0, RECEIVE_WINDOW - wire.DEFAULT_WINDOW))

    # -- the API ----------------------------------------------------------------------------------
    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def receive_data(self, data: bytes) -> None:
        """Handle bytes read from the peer: frames are acted on and complete messages handed to their
        methods before this returns. A peer breaking HTTP/2 gets GOAWAY, and the connection closes."""
        if self.closing:
            return  # what a closed transport would have dropped
        self._reading = True
        try:
            self._receive(data)
        except H2ConnectionError as exc:
            log.warning("HTTP/2 connection error: %s", exc)
            self._write(wire.goaway(self._last_stream_id, exc.code, str(exc).encode()[:256]))
            self.close()
        finally:
            self._reading = False

    def data_to_send(self) -> bytes:
        """What to write to the peer now, in order (empty when nothing is due)."""
        if self._trailers_at:
            self._trailers_at.clear()  # handed out: too late to take back
        out = self._out
        if not out:
            return b""
        data = b"".join(out)
        out.clear()
        return data

    def goaway(self) -> None:
        """Refuse new streams and close once the open ones end (graceful shutdown)."""
        if self._going_away or self.closing:
            return
        self._going_away = True
        self._write(wire.goaway(self._last_stream_id, ErrorCode.NO_ERROR))
        self._close_if_idle()

    def close(self) -> None:
        """Cancel what is open and close now (shutdown's grace has run out, or the peer broke HTTP/2)."""
        for stream in list(self._streams.values()):
            self._write(wire.rst_stream(stream.id, ErrorCode.CANCEL))
            self._end(stream, cancelled=True)
        self.closing = True

    def connection_lost(self) -> None:
        """The transport is gone: every open call is cancelled."""
        self.closing = True
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
        while end - at >= wire.FRAME_HEADER_BYTES:
            length, kind, flags, stream_id = wire.frame_header(view, at)
            if length > MAX_FRAME:
                raise H2ConnectionError(f"frame of {length} bytes", ErrorCode.FRAME_SIZE_ERROR)
            start = at + wire.FRAME_HEADER_BYTES
            if end - start < length:
                break
            at = start + length
            self._frame(kind, flags, stream_id, bytes(view[start:at]))
        if view is buffer:
            del buffer[:at]
        elif at < end:
            buffer += view[at:]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._header_block is not None and kind != FrameType.CONTINUATION:
            raise H2ConnectionError("a header block was interrupted")
        if kind == FrameType.DATA:
            self._data(flags, stream_id, payload)
        elif kind == FrameType.HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == FrameType.CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == FrameType.WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == FrameType.SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == FrameType.PING:
            if len(payload) != 8 or stream_id:
                raise H2ConnectionError("malformed PING", ErrorCode.FRAME_SIZE_ERROR)
            if not flags & ACK:
                self._write(wire.frame(FrameType.PING, ACK, 0, payload))
        elif kind == FrameType.RST_STREAM:
            stream = self._streams.get(stream_id)
            if stream is not None:
                self._end(stream, cancelled=True)
            elif stream_id in self._trailers_at:
                # Envoy ends each ext_proc stream with END_STREAM and RST_STREAM in one write: the
                # trailers answering the first are not wanted; not sending them spares a write and a
                # wake-up on both sides.
                self._out[self._trailers_at.pop(stream_id)] = b""
        elif kind == FrameType.GOAWAY:
            self._going_away = True
            self._close_if_idle()
        elif kind == FrameType.PUSH_PROMISE:
            raise H2ConnectionError("a client may not push")
        # PRIORITY and unknown frame types are ignored, as RFC 9113 allows.

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise H2ConnectionError("DATA on stream 0")
        self._unacked += len(payload)
        if self._unacked >= RECEIVE_WINDOW // 2:
            self._write(wire.window_update(0, self._unacked))
            self._unacked = 0
        stream = self._streams.get(stream_id)
        if stream is None or stream.remote_closed:
            return  # a stream this side already ended: the peer may not know yet
        consumed = len(payload)
        payload = wire.unpad(payload, flags)
        if payload:
            self._messages(stream, payload)
        if flags & END_STREAM:
            # Unless a message just refused closed (and reset) the stream from this side.
            if not stream.remote_closed:
                self._remote_closed(stream)
        elif not stream.finished:
            stream.unacked += consumed
            if stream.unacked >= RECEIVE_WINDOW // 2:
                self._write(wire.window_update(stream.id, stream.unacked))
                stream.unacked = 0

    def _messages(self, stream: _Stream, payload: bytes) -> None:
        inbox = stream.inbox
        if inbox:
            inbox += payload
            data: bytes | bytearray = inbox
        else:
            data = payload
        at, end = 0, len(data)
        while end - at >= 5 and not stream.finished:
            compressed, length = wire.grpc_prefix(data, at)
            if length > self._max_message:
                self._refuse(
                    stream, Status.RESOURCE_EXHAUSTED, f"message larger than {self._max_message} bytes"
                )
                return
            if end - at - 5 < length:
                break
            if compressed:
                self._refuse(stream, Status.UNIMPLEMENTED, "compressed messages are not supported")
                return
            message = bytes(data[at + 5 : at + 5 + length])
            at += 5 + length
            self._dispatch(stream, message)
        if stream.finished:
            inbox.clear()
        elif data is inbox:
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
        if flags & PRIORITY:
            payload = payload[5:]
        if flags & END_HEADERS:
            self._header_block_done(stream_id, flags, payload)
        else:
            self._header_block = (stream_id, flags, bytearray(payload))

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        pending = self._header_block
        if pending is None or pending[0] != stream_id:
            raise H2ConnectionError("CONTINUATION without its HEADERS")
        pending[2].extend(payload)
        if len(pending[2]) > MAX_FRAME:
            raise H2ConnectionError("header block too large", ErrorCode.FRAME_SIZE_ERROR)
        if flags & END_HEADERS:
            self._header_block = None
            self._header_block_done(stream_id, pending[1], bytes(pending[2]))

    def _header_block_done(self, stream_id: int, flags: int, block: bytes) -> None:
        fields = self._decoder.decode(block)  # always: the table must follow every block
        stream = self._streams.get(stream_id)
        if stream is not None:  # the client's trailers
            if flags & END_STREAM:
                self._remote_closed(stream)
            return
        if stream_id <= self._last_stream_id:
            return  # trailers of a stream this side already ended
        if stream_id % 2 == 0:
            raise H2ConnectionError("a client stream id must be odd")
        self._last_stream_id = stream_id
        if self._going_away:
            self._write(wire.rst_stream(stream_id, ErrorCode.REFUSED_STREAM))
            return
        stream = _Stream(self, stream_id, self._peer_window)
        self._streams[stream_id] = stream
        path = next((value for name, value in fields if name == b":path"), b"")
        method = self._methods.get(path)
        if method is None:
            stream.remote_closed = bool(flags & END_STREAM)
            stream.finish(Status.UNIMPLEMENTED, f"unknown method {path.decode('latin-1')}")
            return
        try:
            stream.call = method(stream)
        except Exception:
            log.exception("gRPC method %s failed to start", path.decode("latin-1"))
            stream.finish(Status.INTERNAL, "internal error")
            return
        if flags & END_STREAM:
            self._remote_closed(stream)

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

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2ConnectionError("malformed WINDOW_UPDATE", ErrorCode.FRAME_SIZE_ERROR)
        increment = wire.u32(payload) & wire.MAX_WINDOW
        if not stream_id:
            self._send_window += increment
            if self._send_window > wire.MAX_WINDOW:
                raise H2ConnectionError("connection window overflow", ErrorCode.FLOW_CONTROL_ERROR)
            for stream in list(self._streams.values()):
                self._drain(stream)
            return
        target = self._streams.get(stream_id)
        if target is not None:
            target.send_window += increment
            self._drain(target)

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise H2ConnectionError("SETTINGS on a stream")
        if flags & ACK:
            return
        for key, value in wire.parse_settings(payload):
            if key == Setting.INITIAL_WINDOW_SIZE:
                if value > wire.MAX_WINDOW:
                    raise H2ConnectionError("initial window too large", ErrorCode.FLOW_CONTROL_ERROR)
                delta, self._peer_window = value - self._peer_window, value
                for stream in self._streams.values():
                    stream.send_window += delta
            elif key == Setting.MAX_FRAME_SIZE:
                if not wire.DEFAULT_MAX_FRAME <= value <= 2**24 - 1:
                    raise H2ConnectionError("bad MAX_FRAME_SIZE")
                self._peer_max_frame = value
        self._write(wire.frame(FrameType.SETTINGS, ACK, 0))
        for stream in list(self._streams.values()):
            self._drain(stream)

    # -- writing ----------------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        if not self.closing:  # past the close, as a closing transport would, nothing more goes out
            self._out.append(data)

    def _output_waiting(self) -> None:
        if self._out and self._on_output is not None:
            self._on_output()

    def _drain(self, stream: _Stream) -> None:
        """Send what the windows allow of the stream's responses, then its trailers."""
        outbox = stream.outbox
        while outbox:
            window = min(stream.send_window, self._send_window)
            if window <= 0:
                return
            chunk = outbox[0]
            size = min(len(chunk), window, self._peer_max_frame)
            if size < len(chunk):
                outbox[0] = chunk[size:]
                chunk = chunk[:size]
            else:
                outbox.popleft()
            stream.send_window -= size
            self._send_window -= size
            self._write(wire.frame(FrameType.DATA, 0, stream.id, chunk))
        if stream.trailers is not None:
            if not self.closing:
                self._trailers_at[stream.id] = len(self._out)
            self._write(stream.trailers)
            stream.trailers = None
            if not stream.remote_closed:
                # The call is over: tell the client to stop sending (as gRPC servers do).
                self._write(wire.rst_stream(stream.id, ErrorCode.NO_ERROR))
                stream.remote_closed = True
            self._close_if_done(stream)

    def _refuse(self, stream: _Stream, status: Status, message: str) -> None:
        """End a call this side cannot go on with; the method hears it as cancelled."""
        stream.inbox.clear()
        call, stream.call = stream.call, None
        stream.finish(status, message)
        if call is not None:
            call.cancelled()

    def _close_if_done(self, stream: _Stream) -> None:
        if stream.finished and stream.remote_closed and stream.trailers is None and not stream.outbox:
            del self._streams[stream.id]
            self._close_if_idle()

    def _end(self, stream: _Stream, *, cancelled: bool) -> None:
        self._streams.pop(stream.id, None)
        stream.finished = stream.remote_closed = True
        stream.outbox.clear()
        stream.trailers = None
        call, stream.call = stream.call, None
        if cancelled and call is not None:
            call.cancelled()
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        if self._streams:
            return
        if self._on_idle is not None:
            self._on_idle()
        if self._going_away:
            self.closing = True
