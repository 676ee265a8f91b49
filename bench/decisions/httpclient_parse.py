"""CPU per response of the scrape client's protocol, parsing alone: no socket, no event loop I/O.

``pointsman_collector.httpclient``'s connection (an ``asyncio.BufferedProtocol``) is driven the way the
event loop drives it, with a transport that sends nothing: a request, then the response's bytes copied
into the protocol's buffer (``get_buffer``/``buffer_updated``, in reads of at most 256 KiB, as uvloop
reads), then the callback with the page. Two responses of a fixture page of
``shared/tests/data/vllm-metrics`` alternate (their lengths differ, so no head repeats twice in a row),
framed by Content-Length as vLLM sends them, or chunked in 8 KiB chunks. Best of ``--repeats`` turns
of ``--responses`` each, in this process's CPU time.

It reads whichever ``pointsman_collector`` is imported, so one command measures two trees side by
side (the older one first on ``PYTHONPATH``):

    .venv/bin/python bench/decisions/httpclient_parse.py [--page vllm-data-parallel]
    PYTHONPATH=/tmp/base/services/collector/src .venv/bin/python bench/decisions/httpclient_parse.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from pointsman_collector import httpclient

PAGES = Path(__file__).resolve().parents[2] / "shared" / "tests" / "data" / "vllm-metrics"
READ = 256 * 1024
HEAD = b"HTTP/1.1 200 OK\r\nDate: Wed, 02 Dec 2026 16:00:00 GMT\r\nServer: uvicorn\r\n"
TYPE = b"Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"


class _Transport:
    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def _connection() -> Any:
    try:
        from pointsman_collector.http1 import Limits
    except ImportError:  # the tree before the sans-IO parser: the connection took the body cap
        return httpclient._Connection(httpclient.DEFAULT_MAX_BODY)  # type: ignore[arg-type]
    return httpclient._Connection(Limits())


def responses(page: bytes, framing: str) -> tuple[bytes, bytes]:
    pages = (page, page + b"# EOF\n")
    if framing == "length":
        return tuple(HEAD + TYPE + b"Content-Length: %d\r\n\r\n" % len(p) + p for p in pages)  # type: ignore[return-value]
    chunked = []
    for p in pages:
        chunks = b"".join(
            b"%x\r\n%s\r\n" % (len(p[at : at + 8192]), p[at : at + 8192]) for at in range(0, len(p), 8192)
        )
        chunked.append(HEAD + TYPE + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n")
    return chunked[0], chunked[1]


async def measure(page: bytes, framing: str, count: int, repeats: int) -> float:
    connection = _connection()
    connection.connection_made(_Transport())
    answers: list[Any] = []
    wires = [memoryview(wire) for wire in responses(page, framing)]
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        for index in range(count):
            connection.request(b"GET /metrics HTTP/1.1\r\n\r\n", answers.append, reused=True)
            data = wires[index % 2]  # a memoryview: slicing it copies nothing
            at = 0
            while at < len(data):
                view = connection.get_buffer(-1)
                size = min(len(view), len(data) - at, READ)
                view[:size] = data[at : at + size]
                connection.buffer_updated(size)
                at += size
        best = min(best, (time.process_time() - started) / count)
        assert len(answers) == count, answers[-1:]
        assert all(len(a.body) - len(page) in (0, 6) for a in answers)
        answers.clear()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--page", default="vllm-current-lora", help="a fixture page's name")
    parser.add_argument("--responses", type=int, default=2000, help="responses per turn")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    page = (PAGES / f"{args.page}.txt").read_bytes()
    results = {
        framing: round(asyncio.run(measure(page, framing, args.responses, args.repeats)) * 1e6, 2)
        for framing in ("length", "chunked")
    }
    print(
        json.dumps(
            {
                "page": args.page,
                "page_bytes": len(page),
                "tree": httpclient.__file__,
                "us_per_response": results,
            }
        )
    )


if __name__ == "__main__":
    main()
