"""Issue #14's attacks over real sockets (``h2_attacks.py``), against both ext_proc servers, with a
well-behaved gRPC client calling the same server all along; and the native server's timers and
connection limit, which need a socket and a clock.

The native server must hang up on each attacker with the GOAWAY code its limit names, within a few
thousand frames, while the well-behaved client gets every answer within its 2 s deadline. grpcio is
held to what it does (docs/security.md has both columns): it keeps the well-behaved client answered,
except that a rapid reset or a flood of streams on another connection fails some of that client's
calls (CANCELLED, INTERNAL, or past their deadline on a loaded machine).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from h2_attacks import ATTACKS, DEADLINE, ECHO, grpcio_echo, run
from test_picker_h2grpc_protocol import Calls, Echo, Later, only, parse
from test_picker_h2grpc_server import RawClient

from pointsman_picker.h2grpc import wire
from pointsman_picker.h2grpc.config import Http2Config
from pointsman_picker.h2grpc.server import GrpcServer
from pointsman_picker.h2grpc.wire import ErrorCode, FrameType

# Attacks under which some of grpcio's answers to the well-behaved client fail (CANCELLED, INTERNAL,
# DEADLINE_EXCEEDED: grpcio reads the flood to its end before it answers).
GRPCIO_HURTS = {"rapid reset", "streams never ended"}
NATIVE_ANSWER = {
    "rapid reset": "ENHANCE_YOUR_CALM",
    "PING flood": "ENHANCE_YOUR_CALM",
    "SETTINGS flood": "ENHANCE_YOUR_CALM",
    "zero-length CONTINUATION flood": "ENHANCE_YOUR_CALM",
    "empty DATA flood": "ENHANCE_YOUR_CALM",
    "streams never ended": "ENHANCE_YOUR_CALM",  # past 100 refused, then past the resets budget
    "60 KiB header lists": "COMPRESSION_ERROR",  # a block past 32 KiB is not decoded at all
}


@pytest.fixture
async def native() -> AsyncIterator[tuple[GrpcServer, int]]:
    server = GrpcServer({ECHO: lambda stream: Echo(Calls(), stream)}, max_message_bytes=4 << 20)
    port = await server.start("127.0.0.1", 0)
    try:
        yield server, port
    finally:
        await server.stop(0)


@pytest.mark.parametrize("attack", ATTACKS)
async def test_the_native_server_hangs_up_on_each_attack_and_keeps_answering_the_others(native, attack):
    server, port = native
    outcome = await run(port, attack)
    assert outcome.goaway == NATIVE_ANSWER[attack], outcome
    assert outcome.closed
    assert outcome.sent <= 2_000, outcome  # hung up within a few thousand frames
    assert outcome.failures == [], outcome
    assert outcome.slowest < DEADLINE
    assert outcome.calls >= 3
    assert server.connections == 1  # the well-behaved client's, once the attacker is gone
    assert server.open_streams == 0


@pytest.mark.parametrize("attack", ATTACKS)
async def test_grpcio_under_the_same_attacks(attack):
    async with grpcio_echo() as port:
        outcome = await run(port, attack)
    assert outcome.calls >= 3, outcome
    if attack not in GRPCIO_HURTS:
        assert outcome.failures == [], outcome
        assert outcome.slowest < DEADLINE, outcome
    # What grpcio answers each (for docs/security.md): PING flood GOAWAY ENHANCE_YOUR_CALM; zero-length
    # CONTINUATION and empty DATA floods and oversized headers: the connection closed; rapid reset,
    # SETTINGS flood and streams never ended: nothing, the flood is read to its end.


# -- timers and the connection limit (native) ------------------------------------------------------------
async def started(config: Http2Config, method: type = Echo) -> tuple[GrpcServer, int]:
    calls = Calls()
    server = GrpcServer({ECHO: lambda stream: method(calls, stream)}, max_message_bytes=1 << 20, http2=config)
    return server, await server.start("127.0.0.1", 0)


async def test_a_preface_sent_byte_by_byte_is_cut_at_the_handshake_timeout():
    # 300 such connections stayed open for minutes.
    server, port = await started(Http2Config(handshake_timeout=0.3))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        began = time.perf_counter()

        async def trickle() -> None:
            for byte in wire.PREFACE:
                writer.write(bytes([byte]))
                await asyncio.sleep(0.05)

        trickling = asyncio.create_task(trickle())
        data = await asyncio.wait_for(reader.read(), 2)  # until the server closes
        assert time.perf_counter() - began < 1.0
        trickling.cancel()
        (goaway,) = only(parse(data), FrameType.GOAWAY)  # after the server's SETTINGS and WINDOW_UPDATE
        assert wire.u32(goaway.payload, 4) == ErrorCode.PROTOCOL_ERROR
        assert server.connections == 0
        writer.close()
    finally:
        await server.stop(0)


async def test_a_connection_with_no_stream_open_goes_away_at_the_idle_timeout():
    server, port = await started(Http2Config(idle_timeout=0.4))
    try:
        client = await RawClient.connect(port)
        client.headers(1)  # a call keeps it busy...
        client.data(1, wire.grpc_message(b"x"), end_stream=True)
        await client.call_result(1)
        began = time.perf_counter()  # ...then nothing is open
        _, goaway = await client.until(FrameType.GOAWAY)
        assert wire.u32(goaway, 4) == ErrorCode.NO_ERROR
        assert 0.3 <= time.perf_counter() - began < 1.5
        assert await client.closed()
        client.close()
    finally:
        await server.stop(0)


async def test_connections_past_the_limit_get_goaway_and_the_others_go_on():
    server, port = await started(Http2Config(max_connections=2))
    try:
        first = await RawClient.connect(port)
        second = await RawClient.connect(port)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        data = await asyncio.wait_for(reader.read(), 2)  # SETTINGS, GOAWAY, closed
        assert b"too many connections" in data
        writer.close()
        assert server.refused_connections == 1
        for client, stream_id in ((first, 1), (second, 1)):
            client.headers(stream_id)
            client.data(stream_id, wire.grpc_message(b"still"), end_stream=True)
            body, _ = await client.call_result(stream_id)
            assert body == wire.grpc_message(b"still")
            client.close()
    finally:
        await server.stop(0)


async def test_a_connection_past_its_max_age_goes_away_then_open_calls_are_cut_after_the_grace():
    server, port = await started(Http2Config(max_connection_age=0.3, max_connection_age_grace=0.3), Later)
    try:
        client = await RawClient.connect(port)
        client.headers(1)  # never answered: open until the grace runs out
        _, goaway = await client.until(FrameType.GOAWAY)
        assert wire.u32(goaway, 4) == ErrorCode.NO_ERROR
        assert wire.u32(goaway) == 1  # stream 1 may still finish
        began = time.perf_counter()
        _, cancel = await client.until(FrameType.RST_STREAM, 1)
        assert wire.u32(cancel) == ErrorCode.CANCEL
        assert 0.2 <= time.perf_counter() - began < 1.0
        assert await client.closed()
        client.close()
    finally:
        await server.stop(0)
