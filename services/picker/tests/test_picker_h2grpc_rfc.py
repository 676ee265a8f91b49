"""RFC 9113's connection and stream errors, one row each, replayed against the sans-IO protocol.

Each row opens stream 1 (one message answered, the request not ended) where the case needs an open
stream, sends the offending frames and says what must come back: a connection error (GOAWAY with its
code, the connection closed, the open call cancelled) or a stream error (RST_STREAM with its code on
that stream, the connection going on: a call on a new stream is still answered).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from test_picker_h2grpc_protocol import ECHO, Frame, Later, Peer, only, parse

from pointsman_picker.h2grpc import wire
from pointsman_picker.h2grpc.budgets import MAX_SETTINGS
from pointsman_picker.h2grpc.limits import Limits
from pointsman_picker.h2grpc.wire import ACK, END_HEADERS, END_STREAM, PRIORITY, ErrorCode, FrameType, Setting

REQUEST = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", ECHO),
    (":authority", "picker"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


def request(peer: Peer, stream_id: int, fields: list[tuple[str, str]], *, end_stream: bool = True) -> bytes:
    flags = END_HEADERS | (END_STREAM if end_stream else 0)
    return wire.frame(FrameType.HEADERS, flags, stream_id, peer.encoder.encode(fields))


def with_field(name: str, value: str) -> list[tuple[str, str]]:
    return [*REQUEST, (name, value)]


def opened(peer: Peer) -> None:
    assert only(peer.send(peer.headers(1), peer.message(1, b"open")), FrameType.DATA, 1)


@dataclass(frozen=True)
class Conn:
    code: ErrorCode


@dataclass(frozen=True)
class Stream:
    stream_id: int
    code: ErrorCode


Case = Callable[[Peer], bytes]

CASES: list[tuple[str, Case, Conn | Stream]] = [
    # flow control (§6.9)
    (
        "DATA past the stream's window",
        lambda p: p.data(1, b"\0" * (Limits().initial_window_size - 8)),  # 9 bytes taken by "open"
        Stream(1, ErrorCode.FLOW_CONTROL_ERROR),
    ),
    (
        "WINDOW_UPDATE of 0 on a stream",
        lambda p: wire.window_update(1, 0),
        Stream(1, ErrorCode.PROTOCOL_ERROR),
    ),
    (
        "WINDOW_UPDATE of 0 on the connection",
        lambda p: wire.window_update(0, 0),
        Conn(ErrorCode.PROTOCOL_ERROR),
    ),
    (
        "a stream's send window past 2^31-1",
        lambda p: wire.window_update(1, wire.MAX_WINDOW),
        Stream(1, ErrorCode.FLOW_CONTROL_ERROR),
    ),
    (
        "SETTINGS pushing a stream window past 2^31-1",
        lambda p: (
            wire.window_update(1, wire.MAX_WINDOW - 70_000)
            + wire.settings_frame({Setting.INITIAL_WINDOW_SIZE: 1_000_000})
        ),
        Conn(ErrorCode.FLOW_CONTROL_ERROR),
    ),
    # RST_STREAM, WINDOW_UPDATE and DATA where they may not be (§5.1, §6.1, §6.4, §6.9)
    (
        "RST_STREAM of 3 bytes",
        lambda p: wire.frame(FrameType.RST_STREAM, 0, 1, b"\0\0\0"),
        Conn(ErrorCode.FRAME_SIZE_ERROR),
    ),
    (
        "RST_STREAM on stream 0",
        lambda p: wire.rst_stream(0, ErrorCode.CANCEL),
        Conn(ErrorCode.PROTOCOL_ERROR),
    ),
    (
        "RST_STREAM on an idle stream",
        lambda p: wire.rst_stream(7, ErrorCode.CANCEL),
        Conn(ErrorCode.PROTOCOL_ERROR),
    ),
    ("WINDOW_UPDATE on an idle stream", lambda p: wire.window_update(9, 1), Conn(ErrorCode.PROTOCOL_ERROR)),
    (
        "WINDOW_UPDATE of 5 bytes",
        lambda p: wire.frame(FrameType.WINDOW_UPDATE, 0, 0, b"\0\0\0\0\1"),
        Conn(ErrorCode.FRAME_SIZE_ERROR),
    ),
    ("DATA on an idle stream", lambda p: p.data(5, b"x"), Conn(ErrorCode.PROTOCOL_ERROR)),
    ("DATA on a server-side (even) stream", lambda p: p.data(2, b"x"), Conn(ErrorCode.PROTOCOL_ERROR)),
    (
        "DATA on a closed stream",
        lambda p: p.headers(3) + p.message(3, b"x", end_stream=True) + p.data(3, b"late"),
        Stream(3, ErrorCode.STREAM_CLOSED),
    ),
    # stream ids (§5.1.1)
    (
        "a stream id below the last",
        lambda p: p.headers(5, end_stream=True) + p.headers(3, end_stream=True),
        Conn(ErrorCode.PROTOCOL_ERROR),
    ),
    # malformed requests (§8.2, §8.3): stream errors
    (
        "an uppercase field name",
        lambda p: request(p, 3, with_field("X-Upper", "1")),
        Stream(3, ErrorCode.PROTOCOL_ERROR),
    ),
    (
        "a connection-specific field",
        lambda p: request(p, 3, with_field("connection", "close")),
        Stream(3, ErrorCode.PROTOCOL_ERROR),
    ),
    (
        "transfer-encoding",
        lambda p: request(p, 3, with_field("transfer-encoding", "chunked")),
        Stream(3, ErrorCode.PROTOCOL_ERROR),
    ),
    (
        "te other than trailers",
        lambda p: request(p, 3, with_field("te", "gzip")),
        Stream(3, ErrorCode.PROTOCOL_ERROR),
    ),
    (
        "a pseudo-header after a field",
        lambda p: request(p, 3, [*REQUEST[1:], REQUEST[0]]),
        Stream(3, ErrorCode.PROTOCOL_ERROR),
    ),
    (
        "no :path",
        lambda p: request(p, 3, [f for f in REQUEST if f[0] != ":path"]),
        Stream(3, ErrorCode.PROTOCOL_ERROR),
    ),
    (
        "an unknown pseudo-header",
        lambda p: request(p, 3, [(":protocol", "x"), *REQUEST]),
        Stream(3, ErrorCode.PROTOCOL_ERROR),
    ),
    (
        "CR LF in a value",
        lambda p: request(p, 3, with_field("x-a", "1\r\nx-b: 2")),
        Stream(3, ErrorCode.PROTOCOL_ERROR),
    ),
    (
        "trailers without END_STREAM",
        lambda p: wire.frame(FrameType.HEADERS, END_HEADERS, 1, p.encoder.encode([("x-t", "1")])),
        Stream(1, ErrorCode.PROTOCOL_ERROR),
    ),
    (
        "HEADERS depending on itself",
        lambda p: wire.frame(FrameType.HEADERS, END_HEADERS | PRIORITY, 3, b"\0\0\0\3\x10" + p.block()),
        Stream(3, ErrorCode.PROTOCOL_ERROR),
    ),
    # control frames (§6.5, §6.7)
    (
        "PING on a stream",
        lambda p: wire.frame(FrameType.PING, 0, 1, b"8" * 8),
        Conn(ErrorCode.PROTOCOL_ERROR),
    ),
    (
        "a SETTINGS acknowledgement with a payload",
        lambda p: wire.frame(FrameType.SETTINGS, ACK, 0, b"\0\4\0\0\0\0"),
        Conn(ErrorCode.FRAME_SIZE_ERROR),
    ),
    (
        "ENABLE_PUSH of 2",
        lambda p: wire.settings_frame({Setting.ENABLE_PUSH: 2}),
        Conn(ErrorCode.PROTOCOL_ERROR),
    ),
    (
        "more settings in a frame than nghttp2 takes",
        lambda p: wire.frame(FrameType.SETTINGS, 0, 0, b"\0\1\0\0\x10\0" * (MAX_SETTINGS + 1)),
        Conn(ErrorCode.ENHANCE_YOUR_CALM),
    ),
    (
        "GOAWAY on a stream",
        lambda p: wire.frame(FrameType.GOAWAY, 0, 1, b"\0" * 8),
        Conn(ErrorCode.PROTOCOL_ERROR),
    ),
]


@pytest.mark.parametrize(("frames", "expected"), [pytest.param(f, e, id=name) for name, f, e in CASES])
def test_rfc9113_errors(frames: Case, expected: Conn | Stream) -> None:
    peer = Peer()
    peer.connect()
    opened(peer)
    sent = peer.send(frames(peer))
    if isinstance(expected, Conn):
        (goaway,) = only(sent, FrameType.GOAWAY)
        assert wire.u32(goaway.payload, 4) == expected.code, goaway.payload[8:]
        assert peer.protocol.closing
        assert peer.calls.cancelled >= 1  # the open call on stream 1
        return
    assert not only(sent, FrameType.GOAWAY)
    resets = [wire.u32(f.payload) for f in only(sent, FrameType.RST_STREAM, expected.stream_id)]
    assert resets == [expected.code]
    # The connection goes on: a new call is answered.
    frames = peer.send(peer.headers(11), peer.message(11, b"after", end_stream=True))
    assert peer.call_result(frames, 11)[1][b"grpc-status"] == b"0"


def test_the_clients_first_frame_must_be_settings():
    peer = Peer()
    frames = peer.send(wire.PREFACE + wire.frame(FrameType.PING, 0, 0, b"12345678"))
    (goaway,) = only(frames, FrameType.GOAWAY)
    assert wire.u32(goaway.payload, 4) == ErrorCode.PROTOCOL_ERROR
    assert peer.protocol.closing
    assert not peer.protocol.handshake_done


def test_a_handshake_that_does_not_finish_in_time_gets_goaway():
    peer = Peer()
    peer.send(wire.PREFACE[:10])
    peer.protocol.handshake_timed_out(10)
    (goaway,) = parse(peer.protocol.data_to_send())
    assert wire.u32(goaway.payload, 4) == ErrorCode.PROTOCOL_ERROR
    assert b"within 10s" in goaway.payload
    assert peer.protocol.closing


def test_data_on_a_half_closed_stream_is_a_stream_error():
    peer = Peer(method=Later)  # answers later: the stream stays open after the request ends
    peer.connect()
    peer.send(peer.headers(1), peer.message(1, b"q", end_stream=True))
    (reset,) = peer.send(peer.data(1, b"more"))
    assert reset == Frame(FrameType.RST_STREAM, 0, 1, ErrorCode.STREAM_CLOSED.to_bytes(4, "big"))
    assert peer.calls.cancelled == 1


def test_frames_after_this_sides_reset_are_dropped():
    # RFC 9113 §5.1: the peer may have sent them before it saw the RST_STREAM.
    peer = Peer(max_message_bytes=10)
    peer.connect()
    frames = peer.send(peer.headers(1), peer.message(1, b"x" * 11))
    assert only(frames, FrameType.RST_STREAM, 1)
    trailers = wire.frame(FrameType.HEADERS, END_HEADERS | END_STREAM, 1, peer.encoder.encode([("x-t", "1")]))
    assert peer.send(peer.message(1, b"late"), wire.window_update(1, 10), trailers) == []
    frames = peer.send(peer.headers(3), peer.message(3, b"ok", end_stream=True))  # HPACK kept in step
    assert peer.call_result(frames, 3)[1][b"grpc-status"] == b"0"


def test_an_unexpected_error_is_goaway_internal_error_and_a_log_line_with_the_stream(caplog, monkeypatch):
    peer = Peer()
    peer.connect()

    def broken(*args: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(peer.protocol, "_window_update", broken)
    opened(peer)
    with caplog.at_level(logging.ERROR, logger="pointsman_picker.h2grpc.protocol"):
        frames = peer.send(wire.window_update(1, 100))
    (goaway,) = only(frames, FrameType.GOAWAY)
    assert wire.u32(goaway.payload, 4) == ErrorCode.INTERNAL_ERROR
    assert frames[-1] == Frame(FrameType.RST_STREAM, 0, 1, ErrorCode.CANCEL.to_bytes(4, "big"))
    assert peer.protocol.closing
    (record,) = caplog.records
    assert "stream 1" in record.getMessage()
    assert record.exc_info is not None
