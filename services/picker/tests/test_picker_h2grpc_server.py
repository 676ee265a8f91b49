"""The native gRPC server on a real socket: a real grpc client for whole calls, big messages and many
calls at once, and a raw HTTP/2 client for what needs the socket (the connection closing, shutdown's
grace, Envoy's END_STREAM + RST_STREAM in one write). The HTTP/2 protocol itself is tested by replaying
bytes, without sockets, in test_picker_h2grpc_protocol.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
from test_picker_h2grpc_protocol import ECHO, MAX_MESSAGE, Calls, Echo

from pointsman_picker.h2grpc import wire
from pointsman_picker.h2grpc.server import GrpcServer
from pointsman_picker.h2grpc.wire import ErrorCode, FrameType, HeaderDecoder


@dataclass
class Running:
    server: GrpcServer
    port: int
    calls: Calls


@pytest.fixture
async def echo() -> AsyncIterator[Running]:
    calls = Calls()
    server = GrpcServer({ECHO: lambda stream: Echo(calls, stream)}, max_message_bytes=MAX_MESSAGE)
    port = await server.start("127.0.0.1", 0)
    try:
        yield Running(server, port, calls)
    finally:
        await server.stop(0)


def _identity(data: bytes) -> bytes:
    return data


async def grpc_echo(port: int, *messages: bytes) -> list[bytes]:
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{port}",
        options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)],
    ) as channel:
        call = channel.stream_stream(ECHO, request_serializer=_identity, response_deserializer=_identity)
        return [answer async for answer in call(iter(messages))]


# -- a real gRPC client ---------------------------------------------------------------------------------
async def test_a_grpc_client_gets_every_message_back_in_order(echo):
    assert await grpc_echo(echo.port, b"one", b"", b"three") == [b"one", b"", b"three"]
    assert echo.calls.half_closed == 1


async def test_big_messages_cross_both_flow_control_windows(echo):
    # 3 MiB each way: far past the grpc client's first 64 KiB window and one frame's 16 KiB.
    big = bytes(range(256)) * (3 * 4096)
    assert await grpc_echo(echo.port, big, big[:70_000]) == [big, big[:70_000]]


async def test_concurrent_calls_on_one_connection(echo):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{echo.port}") as channel:
        call = channel.stream_stream(ECHO, request_serializer=_identity, response_deserializer=_identity)

        async def one(i: int) -> list[bytes]:
            return [answer async for answer in call(iter([str(i).encode()] * 3))]

        results = await asyncio.gather(*(one(i) for i in range(50)))
    assert results == [[str(i).encode()] * 3 for i in range(50)]


async def test_an_unknown_method_is_unimplemented(echo):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{echo.port}") as channel:
        call = channel.unary_unary("/test.Echo/Nope", request_serializer=_identity)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call(b"x")
    assert raised.value.code() is grpc.StatusCode.UNIMPLEMENTED


async def test_a_method_that_raises_ends_its_call_with_internal(echo):
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await grpc_echo(echo.port, b"ok", b"fail", b"never")
    assert raised.value.code() is grpc.StatusCode.INTERNAL
    assert echo.calls.messages == [b"ok", b"fail"]
    assert echo.calls.cancelled == 1


async def test_a_message_over_the_cap_is_resource_exhausted():
    calls = Calls()
    server = GrpcServer({ECHO: lambda stream: Echo(calls, stream)}, max_message_bytes=100)
    port = await server.start("127.0.0.1", 0)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await grpc_echo(port, b"x" * 101)
        assert raised.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert await grpc_echo(port, b"x" * 100) == [b"x" * 100]  # the connection goes on
    finally:
        await server.stop(0)


# -- a raw HTTP/2 client --------------------------------------------------------------------------------
_REQUEST_HEADERS = (
    wire.encode_literal(b":method", b"POST")
    + wire.encode_literal(b":scheme", b"http")
    + wire.encode_literal(b":path", ECHO.encode())
    + wire.encode_literal(b"content-type", b"application/grpc")
)


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = HeaderDecoder()

    @classmethod
    async def connect(cls, port: int) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer)
        client.send(wire.PREFACE + wire.settings_frame({}))
        kind, flags, _, _ = await client.read()
        assert kind == FrameType.SETTINGS
        assert not flags
        return client

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def headers(self, stream_id: int, *, end_stream: bool = False, block: bytes = _REQUEST_HEADERS) -> None:
        flags = wire.END_HEADERS | (wire.END_STREAM if end_stream else 0)
        self.send(wire.frame(FrameType.HEADERS, flags, stream_id, block))

    def data(self, stream_id: int, payload: bytes, *, end_stream: bool = False) -> None:
        self.send(wire.frame(FrameType.DATA, wire.END_STREAM if end_stream else 0, stream_id, payload))

    async def read(self) -> tuple[int, int, int, bytes]:
        header = await asyncio.wait_for(self.reader.readexactly(wire.FRAME_HEADER_BYTES), 5)
        length, kind, flags, stream_id = wire.frame_header(header, 0)
        return kind, flags, stream_id, await self.reader.readexactly(length)

    async def until(self, kind: int, stream_id: int | None = None) -> tuple[int, bytes]:
        """Read (answering nothing) until a frame of ``kind``; its (flags, payload)."""
        while True:
            got, flags, sid, payload = await self.read()
            if got == kind and (stream_id is None or sid == stream_id):
                return flags, payload

    async def call_result(self, stream_id: int) -> tuple[bytes, dict[bytes, bytes]]:
        """The stream's response body and its trailers (or trailers-only headers)."""
        body = b""
        while True:
            kind, flags, sid, payload = await self.read()
            if sid != stream_id:
                continue
            if kind == FrameType.DATA:
                body += payload
            elif kind == FrameType.HEADERS:
                fields = dict(self.decoder.decode(payload))
                if flags & wire.END_STREAM:
                    return body, fields

    async def closed(self) -> bool:
        try:
            while await asyncio.wait_for(self.reader.read(65536), 5):
                pass
        except ConnectionError:
            pass
        return True

    def close(self) -> None:
        self.writer.close()


@pytest.fixture
async def raw(echo) -> AsyncIterator[RawClient]:
    client = await RawClient.connect(echo.port)
    try:
        yield client
    finally:
        client.close()


async def test_data_on_stream_zero_is_a_connection_error(echo, raw):
    raw.data(0, b"x")
    _, payload = await raw.until(FrameType.GOAWAY)
    assert wire.u32(payload, 4) == ErrorCode.PROTOCOL_ERROR
    assert await raw.closed()


async def stop_with_a_call_open(
    echo: Running, raw: RawClient, grace: float
) -> tuple[asyncio.Task[None], bytes]:
    """Open stream 1 (one message answered, the request not ended), then start a shutdown; the
    shutdown task and the GOAWAY it sent."""
    raw.headers(1)
    raw.data(1, wire.grpc_message(b"open"))
    await raw.until(FrameType.DATA, 1)
    stopping = asyncio.create_task(echo.server.stop(grace))
    _, goaway = await raw.until(FrameType.GOAWAY)
    return stopping, goaway


async def test_shutdown_refuses_new_streams_and_cancels_open_ones_after_the_grace(echo, raw):
    stopping, payload = await stop_with_a_call_open(echo, raw, 0.3)
    assert wire.u32(payload) == 1
    assert wire.u32(payload, 4) == ErrorCode.NO_ERROR
    raw.headers(3, end_stream=True)
    _, refused = await raw.until(FrameType.RST_STREAM, 3)
    assert wire.u32(refused) == ErrorCode.REFUSED_STREAM
    _, cancel = await raw.until(FrameType.RST_STREAM, 1)
    assert wire.u32(cancel) == ErrorCode.CANCEL
    await stopping
    assert echo.calls.cancelled == 1
    assert await raw.closed()


async def test_shutdown_waits_for_open_calls_that_finish_within_the_grace(echo, raw):
    stopping, _ = await stop_with_a_call_open(echo, raw, 5)
    raw.data(1, wire.grpc_message(b"last"), end_stream=True)
    body, trailers = await raw.call_result(1)
    assert body == wire.grpc_message(b"last")
    assert trailers[b"grpc-status"] == b"0"
    await asyncio.wait_for(stopping, 2)  # well before the grace
    assert echo.calls.cancelled == 0


async def test_a_reset_right_after_the_half_close_gets_no_trailers(echo, raw):
    # What Envoy does at the end of every ext_proc stream: END_STREAM and RST_STREAM in one write.
    raw.headers(1)
    raw.send(
        wire.frame(FrameType.DATA, wire.END_STREAM, 1, wire.grpc_message(b"last"))
        + wire.rst_stream(1, ErrorCode.CANCEL)
    )
    raw.send(wire.frame(FrameType.PING, 0, 0, b"syncsync"))
    seen = []
    while True:
        kind, flags, stream_id, _ = await raw.read()
        if kind == FrameType.PING:
            break
        seen.append((kind, flags, stream_id))
    assert (FrameType.DATA, 0, 1) in seen  # the answer to "last" still goes out
    assert not [frame for frame in seen if frame[0] == FrameType.HEADERS and frame[1] & wire.END_STREAM]
    assert echo.calls.half_closed == 1
    assert echo.calls.cancelled == 0
    assert echo.server.open_streams == 0
