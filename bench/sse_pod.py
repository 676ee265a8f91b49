"""Backend "pods" for `make bench-picker`'s streamed workload: one process, a listener per pod, each
answering ``GET /metrics`` with a real vLLM page and ``POST /v1/completions`` with ``"stream": true``
as vLLM does: an SSE event per token, one every ``--itl`` seconds, then the usage event (when
``stream_options.include_usage`` asks for it) and ``data: [DONE]``, in HTTP/1.1 chunks (one chunk
per event, so Envoy reads, and shows the picker, one event at a time). A request without
``"stream": true`` gets one JSON completion. Each stream keeps its own clock (token k is due at its
start + k x itl), so concurrent streams' tokens do not line up into bursts.

    python bench/sse_pod.py --ports 8001,8002 --metrics PAGE [--itl 0.01]

A small asyncio Protocol on uvloop rather than the simulator: the pods should cost little and the
same in every setup, since the bench measures what sits between the client and them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
from pathlib import Path
from typing import cast

import uvloop

_LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding: *chunked", re.IGNORECASE)
_STREAM = re.compile(rb'"stream" *: *true')
_MAX_TOKENS = re.compile(rb'"max_tokens" *: *(\d+)')
_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(doc: object) -> bytes:
    return _chunk(b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n")


# What vLLM sends per token of a streamed completion (the text differs; the size is about this).
TOKEN = _event(
    {
        "id": "cmpl-bench",
        "object": "text_completion",
        "created": 0,
        "model": "tweet-summary-0",
        "choices": [{"index": 0, "text": " tok", "logprobs": None, "finish_reason": None}],
    }
)
DONE = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


def usage_event(tokens: int) -> bytes:
    usage = {"prompt_tokens": 6, "completion_tokens": tokens, "total_tokens": 6 + tokens}
    doc = {"id": "cmpl-bench", "object": "text_completion", "created": 0, "model": "tweet-summary-0"}
    return _event(doc | {"choices": [], "usage": usage})


def plain_response(body: bytes, content_type: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (content_type, len(body))
    return head + body


COMPLETION = json.dumps(
    {
        "id": "cmpl-bench",
        "object": "text_completion",
        "created": 0,
        "model": "tweet-summary-0",
        "choices": [{"index": 0, "text": " Points.", "finish_reason": "length", "logprobs": None}],
        "usage": {"prompt_tokens": 6, "completion_tokens": 1, "total_tokens": 7},
    }
).encode()


def _request(buffer: bytes) -> tuple[bytes, bytes, bytes] | None:
    """``(head, body, rest)`` of the first whole request in ``buffer``, its body by Content-Length or
    chunked (Envoy forwards a FULL_DUPLEX_STREAMED body chunked); None until it is all in."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    head, at = buffer[:end], end + 4
    if _CHUNKED.search(head):
        parts = []
        while True:
            line_end = buffer.find(b"\r\n", at)
            if line_end < 0:
                return None
            size = int(buffer[at:line_end].split(b";")[0], 16)
            if len(buffer) < line_end + 2 + size + 2:
                return None
            parts.append(buffer[line_end + 2 : line_end + 2 + size])
            at = line_end + 2 + size + 2
            if size == 0:
                return head, b"".join(parts), buffer[at:]
    match = _LENGTH.search(head)
    length = int(match[1]) if match else 0
    if len(buffer) < at + length:
        return None
    return head, buffer[at : at + length], buffer[at + length :]


class Pod(asyncio.Protocol):
    """One keep-alive connection; one request at a time, as HTTP/1.1 clients send them."""

    def __init__(self, metrics: bytes, itl: float) -> None:
        self._metrics = metrics
        self._itl = itl
        self._buffer = b""
        self._transport: asyncio.Transport | None = None
        self._streaming = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while not self._streaming and self._transport is not None:
            request = _request(self._buffer)
            if request is None:
                return
            head, body, self._buffer = request
            if head.startswith(b"GET /metrics"):
                self._transport.write(plain_response(self._metrics, b"text/plain; version=0.0.4"))
            elif _STREAM.search(body):
                tokens = _MAX_TOKENS.search(body)
                self._stream(int(tokens[1]) if tokens else 16, usage=b"include_usage" in body)
            else:
                self._transport.write(plain_response(COMPLETION, b"application/json"))

    def _stream(self, tokens: int, *, usage: bool) -> None:
        assert self._transport is not None
        self._streaming = True
        self._transport.write(_SSE_HEAD)
        loop = asyncio.get_running_loop()
        start = loop.time()

        def token(k: int) -> None:
            if self._transport is None:
                return
            if k < tokens:
                self._transport.write(TOKEN)
                loop.call_at(start + (k + 1) * self._itl, token, k + 1)
                return
            self._transport.write((usage_event(tokens) if usage else b"") + DONE)
            self._streaming = False
            if self._buffer:
                self.data_received(b"")

        loop.call_at(start + self._itl, token, 0)


async def serve(ports: list[int], metrics: bytes, itl: float) -> None:
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(lambda: Pod(metrics, itl), "127.0.0.1", port) for port in ports]
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ports", required=True, help="comma-separated ports, one pod each")
    parser.add_argument("--metrics", type=Path, required=True, help="the /metrics page")
    parser.add_argument("--itl", type=float, default=0.01, help="seconds between tokens")
    args = parser.parse_args()
    ports = [int(p) for p in args.ports.split(",")]
    uvloop.run(serve(ports, args.metrics.read_bytes(), args.itl))


if __name__ == "__main__":
    main()
