"""CPU per GET of a vLLM metrics page: the collector's own HTTP/1.1 client against httpx, and against h11
(httpx's HTTP/1.1 parser) under the same kind of asyncio protocol as ours.

A server in another process answers every GET on one kept-alive connection with a fixture page of
``shared/tests/data/vllm-metrics`` (Content-Length framing, as vLLM's prometheus_client sends it). This
process runs the clients on uvloop, as the collector does, one after another, each making ``--gets``
GETs in a row, and takes this process's CPU time per GET (best of ``--repeats`` turns; the clients take
turns, so a machine shared with other work slows all alike):

- ``ours``: ``pointsman_collector.httpclient.HttpClient``, driven by callbacks as the collector drives it;
- ``httpx``: ``httpx.AsyncClient().get(url)`` and the body, the usual way to use it;
- ``h11``: an ``asyncio.Protocol`` feeding ``h11.Connection``, the library doing only the parsing.

    .venv/bin/python bench/decisions/httpclient.py [--page vllm-data-parallel] [--gets 400] [--repeats 15]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import cast

import h11
import httpx
import uvloop

from pointsman_collector.errors import FetchError
from pointsman_collector.httpclient import HttpClient, Response

PAGES = Path(__file__).resolve().parents[2] / "shared" / "tests" / "data" / "vllm-metrics"


# --- the server (its own process) -----------------------------------------------------------------


class _Page(asyncio.Protocol):
    """Answers with the two responses in turn: their lengths differ, so no client sees a head twice in a
    row (as on a real pod, whose page grows and shrinks as its values change)."""

    def __init__(self, responses: tuple[bytes, bytes]) -> None:
        self._responses = responses
        self._served = 0
        self._transport: asyncio.Transport | None = None
        self._buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while (end := self._buffer.find(b"\r\n\r\n")) >= 0:
            self._buffer = self._buffer[end + 4 :]
            assert self._transport is not None
            self._served += 1
            self._transport.write(self._responses[self._served % 2])


def serve(page: bytes, conn: Connection) -> None:
    uvloop.run(_serve(page, conn))


async def _serve(page: bytes, conn: Connection) -> None:
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
        b"Content-Length: %d\r\n\r\n"
    )
    longer = page + b"# EOF\n"
    responses = (head % len(page) + page, head % len(longer) + longer)
    server = await asyncio.get_running_loop().create_server(lambda: _Page(responses), "127.0.0.1", 0)
    conn.send(server.sockets[0].getsockname()[1])
    await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # until told to stop
    server.close()


# --- the clients (this process) -------------------------------------------------------------------


async def ours(port: int, gets: int, page: bytes) -> None:
    client = HttpClient("127.0.0.1", port, timeout=1.0)
    finished = asyncio.get_running_loop().create_future()
    left = gets

    def done(result: Response | FetchError) -> None:
        nonlocal left
        assert isinstance(result, Response), result
        assert len(result.body) - len(page) in (0, 6)
        left -= 1
        if left:
            client.start(done)
        else:
            finished.set_result(None)

    client.start(done)
    await finished
    await client.aclose()


async def with_httpx(port: int, gets: int, page: bytes) -> None:
    url = f"http://127.0.0.1:{port}/metrics"
    async with httpx.AsyncClient() as client:
        for _ in range(gets):
            response = await client.get(url)
            assert response.status_code == 200
            assert len(response.content) - len(page) in (0, 6)


class _H11(asyncio.Protocol):
    """One connection whose responses h11 parses; ``get`` sends a request, ``done`` gets the body."""

    def __init__(self, host: str) -> None:
        self._parser = h11.Connection(h11.CLIENT)
        self._request = h11.Request(
            method="GET", target="/metrics", headers=[("Host", host), ("Accept", "text/plain")]
        )
        self._transport: asyncio.Transport | None = None
        self._chunks: list[bytes] = []
        self._done: Callable[[bytes], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def get(self, done: Callable[[bytes], None]) -> None:
        assert self._transport is not None
        self._done = done
        self._transport.write(self._parser.send(self._request) + self._parser.send(h11.EndOfMessage()))

    def data_received(self, data: bytes) -> None:
        self._parser.receive_data(data)
        while (event := self._parser.next_event()) is not h11.NEED_DATA:
            if isinstance(event, h11.Response):
                assert event.status_code == 200
            elif isinstance(event, h11.Data):
                self._chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                body, self._chunks = b"".join(self._chunks), []
                self._parser.start_next_cycle()
                assert self._done is not None
                self._done(body)
                return


async def with_h11(port: int, gets: int, page: bytes) -> None:
    loop = asyncio.get_running_loop()
    transport, connection = await loop.create_connection(lambda: _H11(f"127.0.0.1:{port}"), "127.0.0.1", port)
    finished = loop.create_future()
    left = gets

    def done(body: bytes) -> None:
        nonlocal left
        assert len(body) - len(page) in (0, 6)
        left -= 1
        if left:
            connection.get(done)
        else:
            finished.set_result(None)

    connection.get(done)
    await finished
    transport.close()


CLIENTS: dict[str, Callable[[int, int, bytes], Awaitable[None]]] = {
    "ours": ours,
    "httpx": with_httpx,
    "h11": with_h11,
}


async def measure(port: int, page: bytes, gets: int, repeats: int) -> dict[str, dict[str, float]]:
    best = {name: (float("inf"), float("inf")) for name in CLIENTS}
    for client in CLIENTS.values():
        await client(port, 20, page)  # warm-up: imports, caches, the first connection
    for _ in range(repeats):
        for name, client in CLIENTS.items():
            wall, cpu = time.perf_counter(), time.process_time()
            await client(port, gets, page)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            best[name] = (min(best[name][0], cpu / gets * 1e6), min(best[name][1], wall / gets * 1e6))
    return {
        name: {"cpu_us_per_get": round(c, 1), "wall_us_per_get": round(w, 1)} for name, (c, w) in best.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--page", default="vllm-current-lora", help="a fixture page's name")
    parser.add_argument("--gets", type=int, default=400, help="GETs per client and turn")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    page = (PAGES / f"{args.page}.txt").read_bytes()
    ours_end, server_end = multiprocessing.get_context("spawn").Pipe()
    server = multiprocessing.get_context("spawn").Process(target=serve, args=(page, server_end), daemon=True)
    server.start()
    try:
        port = ours_end.recv()
        results = uvloop.run(measure(port, page, args.gets, args.repeats))
    finally:
        ours_end.send("stop")
        server.join(timeout=5)
    versions = {"h11": h11.__version__, "httpx": httpx.__version__, "uvloop": uvloop.__version__}
    print(json.dumps({"page": args.page, "page_bytes": len(page), "versions": versions, **results}, indent=2))


if __name__ == "__main__":
    main()
