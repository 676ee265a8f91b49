"""The asyncio adapter around the sans-IO protocol, on a fake transport: what it writes, when it closes,
and how it follows the transport's flow control."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from test_picker_h2grpc_protocol import ECHO, MAX_MESSAGE, Calls, Echo, Later, Peer, parse

from pointsman_picker.h2grpc import wire
from pointsman_picker.h2grpc.connection import H2Connection
from pointsman_picker.h2grpc.wire import ErrorCode, FrameType


@dataclass
class FakeTransport:
    writes: list[bytes] = field(default_factory=list)
    closing: bool = False
    reading: bool = True

    def write(self, data: bytes) -> None:
        assert not self.closing, "written after close"
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


@dataclass
class Adapted:
    connection: H2Connection
    transport: FakeTransport
    calls: Calls
    peer: Peer  # only its header encoder: the bytes go through the adapter
    closed: list[H2Connection] = field(default_factory=list)


def adapted(method: type = Echo) -> Adapted:
    calls = Calls()
    closed: list[H2Connection] = []
    connection = H2Connection(
        {ECHO.encode(): lambda stream: method(calls, stream)},
        max_message_bytes=MAX_MESSAGE,
        on_close=closed.append,
        on_idle=lambda: None,
    )
    transport = FakeTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    return Adapted(connection, transport, calls, Peer(), closed)


@pytest.fixture
def conn() -> Adapted:
    conn = adapted()
    conn.connection.data_received(wire.PREFACE + wire.settings_frame({}))
    conn.transport.writes.clear()
    return conn


def test_the_preface_goes_out_in_one_write_on_connect():
    conn = adapted()
    (preface,) = conn.transport.writes
    assert [f.kind for f in parse(preface)] == [FrameType.SETTINGS, FrameType.WINDOW_UPDATE]


def test_one_read_gets_one_write(conn):
    peer = conn.peer
    conn.connection.data_received(peer.headers(1) + peer.message(1, b"a") + peer.message(1, b"b"))
    (written,) = conn.transport.writes
    assert [f.kind for f in parse(written)] == [FrameType.HEADERS, FrameType.DATA, FrameType.DATA]
    conn.connection.data_received(wire.frame(FrameType.PING, wire.ACK, 0, b"12345678"))
    assert len(conn.transport.writes) == 1  # nothing to say: no write at all


def test_a_protocol_error_writes_goaway_then_closes_the_transport(conn):
    conn.connection.data_received(Peer.data(0, b"x"))
    (written,) = conn.transport.writes
    assert wire.u32(parse(written)[-1].payload, 4) == ErrorCode.PROTOCOL_ERROR
    assert conn.transport.closing


def test_a_late_answer_is_written_at_once():
    conn = adapted(Later)
    conn.connection.data_received(wire.PREFACE + wire.settings_frame({}) + conn.peer.headers(1))
    before = len(conn.transport.writes)
    (stream,) = conn.calls.streams
    stream.send(b"later")
    assert len(conn.transport.writes) == before + 1
    assert parse(conn.transport.writes[-1])[-1].payload == wire.grpc_message(b"later")


def test_going_away_with_nothing_open_closes_after_the_goaway(conn):
    conn.connection.go_away()
    (written,) = conn.transport.writes
    assert parse(written)[0].kind == FrameType.GOAWAY
    assert conn.transport.closing


def test_abort_resets_open_calls_and_closes(conn):
    conn.connection.data_received(conn.peer.headers(1))
    conn.connection.abort()
    assert parse(conn.transport.writes[-1])[-1] == (
        FrameType.RST_STREAM,
        0,
        1,
        ErrorCode.CANCEL.to_bytes(4, "big"),
    )
    assert conn.calls.cancelled == 1
    assert conn.transport.closing


def test_nothing_is_written_to_a_closing_transport(conn):
    conn.transport.closing = True
    conn.connection.data_received(wire.frame(FrameType.PING, 0, 0, b"12345678"))
    assert conn.transport.writes == []


def test_a_lost_connection_cancels_its_calls_and_tells_the_server(conn):
    conn.connection.data_received(conn.peer.headers(1))
    assert conn.connection.open_streams == 1
    conn.connection.connection_lost(None)
    assert conn.calls.cancelled == 1
    assert conn.connection.open_streams == 0
    assert conn.closed == [conn.connection]


def test_a_peer_that_stops_reading_stops_being_read(conn):
    conn.connection.pause_writing()
    assert not conn.transport.reading
    conn.connection.resume_writing()
    assert conn.transport.reading


async def test_streams_past_the_per_read_limit_are_handled_on_later_turns_with_reading_paused():
    conn = adapted()
    peer = conn.peer
    conn.connection.data_received(
        wire.PREFACE
        + wire.settings_frame({})
        + b"".join(peer.headers(i, end_stream=True) for i in range(1, 200, 2))
    )
    assert conn.calls.half_closed == 32  # the rest waits for the loop's next turns
    assert not conn.transport.reading
    for _ in range(10):
        await asyncio.sleep(0)
    assert conn.calls.half_closed == 100
    assert conn.transport.reading


async def test_the_backlog_waits_while_the_peer_is_not_reading():
    conn = adapted()
    peer = conn.peer
    conn.connection.data_received(
        wire.PREFACE
        + wire.settings_frame({})
        + b"".join(peer.headers(i, end_stream=True) for i in range(1, 200, 2))
    )
    conn.connection.pause_writing()
    for _ in range(5):
        await asyncio.sleep(0)
    assert conn.calls.half_closed == 32
    conn.connection.resume_writing()
    for _ in range(10):
        await asyncio.sleep(0)
    assert conn.calls.half_closed == 100
    assert conn.transport.reading
