from __future__ import annotations

import asyncio

import pytest

from pointsman_collector.errors import FetchError
from pointsman_collector.httpclient import INITIAL_BUFFER, HttpClient, Response
from pointsman_devstack.ports import free_port

PAGE = b"vllm:num_requests_waiting 3\n" * 100  # 2.8 KB
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


async def get(client: HttpClient) -> Response:
    """One request, awaited: the response, or raises the FetchError; the callback is called once."""
    results: list[Response | FetchError] = []
    answered = asyncio.Event()

    def done(result: Response | FetchError) -> None:
        results.append(result)
        answered.set()

    client.start(done)
    await answered.wait()
    await asyncio.sleep(0)  # a second call would come by now
    [result] = results
    if isinstance(result, FetchError):
        raise result
    return result


def client_for(server, *, timeout: float = 1.0, max_body: int = 64 * 1024) -> HttpClient:
    return HttpClient("127.0.0.1", server.port, timeout=timeout, max_body=max_body)


@pytest.mark.parametrize(
    ("reply", "connections"),
    [
        ({}, 1),
        ({"chunk_size": 1000}, 1),
        ({"chunk_size": 7}, 1),
        ({"close": True}, 3),
        ({"unframed": True}, 3),
        ({"hang_up": True}, 3),
    ],
    ids=["content-length", "chunked", "small chunks", "connection close", "until close", "silent close"],
)
async def test_reads_every_framing_and_reuses_the_connection_when_allowed(
    pod_server, reply: dict[str, object], connections: int
) -> None:
    server = await pod_server(PAGE, **reply)
    client = client_for(server)
    try:
        for _ in range(3):
            assert (await get(client)).body == PAGE
    finally:
        await client.aclose()
    assert (server.requests, server.connections) == (3, connections)


@pytest.mark.parametrize(
    "reply",
    [{}, {"chunk_size": 2048}, {"chunk_size": 100_000}, {"unframed": True}],
    ids=["content-length", "chunked", "one big chunk", "until close"],
)
async def test_pages_larger_than_the_buffer_then_smaller_ones_come_whole(
    pod_server, reply: dict[str, object]
) -> None:
    # The connection's buffer grows for the big page and is reused: what the small page leaves of the
    # big one in it must never show in the small one's body.
    big = bytes(range(256)) * (3 * INITIAL_BUFFER // 256 + 7)
    server = await pod_server(big, **reply)
    client = client_for(server, max_body=4 * INITIAL_BUFFER)
    try:
        for page in (big, PAGE, big, b"x", big):
            server.serve(page, **reply)
            assert (await get(client)).body == page
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ({"status": 500}, "http_status"),
        ({"status": 404, "close": True}, "http_status"),
        ({"delay": 0.5}, "timeout"),
        ({"page": b"x" * 2000}, "too_large"),
        ({"page": b"x" * 2000, "chunk_size": 100}, "too_large"),
        ({"page": b"x" * 2000, "unframed": True}, "too_large"),
        ({"reset": True}, "protocol"),
        ({"raw": b"SSH-2.0-OpenSSH_9.6\r\n\r\n"}, "protocol"),
        ({"raw": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort"}, "protocol"),
        ({"raw": b"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n"}, "protocol"),
        ({"raw": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"}, "protocol"),
        ({"raw": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY"}, "protocol"),
        ({"raw": b"HTTP/1.1 200 OK\r\nbroken header\r\n\r\n"}, "protocol"),
        ({"raw": b"HTTP/1.1 200 OK\r\nContent-"}, "protocol"),
        ({"raw": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc"}, "protocol"),
        ({"raw": CHUNKED + (b"1;" + b"e" * 4000 + b"\r\nx\r\n") * 20}, "too_large"),
        ({"raw": CHUNKED + b"0x3\r\nabc\r\n0\r\n\r\n"}, "protocol"),
        (
            {"raw": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
            "protocol",
        ),
        ({"raw": b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok"}, "protocol"),
    ],
    ids=[
        "500",
        "404 with close",
        "slower than the timeout",
        "content-length over the cap",
        "chunks over the cap",
        "unframed body over the cap",
        "connection reset",
        "not HTTP",
        "body cut short",
        "bad content-length",
        "bad chunk size",
        "chunk without CRLF",
        "header without colon",
        "head cut short",
        "two content-lengths",
        "chunks in long extensions: more framing than twice the body cap",
        "a chunk size int() reads but HTTP does not",
        "transfer-encoding with content-length",
        "bare LF line ends",
    ],
)
async def test_failures_have_a_reason_and_the_next_request_reconnects(
    pod_server, reply: dict[str, object], reason: str
) -> None:
    server = await pod_server(**reply)
    client = client_for(server, timeout=0.2, max_body=1000)
    try:
        with pytest.raises(FetchError) as excinfo:
            await get(client)
        assert excinfo.value.reason == reason
        server.serve(b"ok")
        assert (await get(client)).body == b"ok"
    finally:
        await client.aclose()
    assert server.connections == 2


async def test_a_slow_answer_times_out_after_many_quick_ones(pod_server) -> None:
    # The deadline timer outlives requests: set for an early one, it must still catch a later one.
    server = await pod_server(PAGE)
    client = client_for(server, timeout=0.1)
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        while loop.time() - started < 0.25:
            assert (await get(client)).body == PAGE
            await asyncio.sleep(0.01)
        server.serve(PAGE, delay=0.5)
        with pytest.raises(FetchError) as excinfo:
            await get(client)
        assert excinfo.value.reason == "timeout"
    finally:
        await client.aclose()


async def test_a_closed_port_is_a_connect_error() -> None:
    client = HttpClient("127.0.0.1", free_port(), timeout=1.0)
    try:
        with pytest.raises(FetchError) as excinfo:
            await get(client)
    finally:
        await client.aclose()
    assert excinfo.value.reason == "connect"


async def test_sends_one_plain_get_with_the_host_header() -> None:
    captured: list[bytes] = []

    async def capture(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        captured.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nbody")
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(capture, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = HttpClient("127.0.0.1", port, timeout=1.0)
    try:
        assert (await get(client)).body == b"body"
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()
    assert captured == [
        f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: pointsman-collector\r\n"
        "Accept: text/plain\r\n\r\n".encode()
    ]


async def test_bytes_nobody_asked_for_drop_the_idle_connection_before_they_fill_memory() -> None:
    # A server that keeps sending after its response: bytes nobody asked for drop the connection at
    # once, and the next request goes out on a fresh one.
    flooded = asyncio.Event()
    connections = 0

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            if connections == 1:
                for _ in range(64):
                    writer.write(b"x" * 16 * 1024)  # 1 MB in all
                    await writer.drain()
                await reader.read()  # until the client drops the connection
                flooded.set()
        except ConnectionError:
            flooded.set()
        finally:
            writer.close()

    server = await asyncio.start_server(flood, "127.0.0.1", 0)
    client = HttpClient("127.0.0.1", server.sockets[0].getsockname()[1], timeout=1.0, max_body=1000)
    try:
        assert (await get(client)).body == b"ok"
        await asyncio.wait_for(flooded.wait(), 2.0)
        assert (await get(client)).body == b"ok"
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()
    assert connections == 2
