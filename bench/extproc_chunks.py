"""What one streamed response chunk costs the picker on the native server, without a socket: the
ext_proc messages Envoy sends in the shipped mode (response body STREAMED) for an SSE completion, fed
as HTTP/2 bytes to one connection of the real server (``H2Connection`` on a fake transport, the real
``ExtProcService`` and ``RequestStream``), one chunk per read as Envoy sends them at a token's pace.

    .venv/bin/python bench/extproc_chunks.py [--chunks 2000] [--repeats 20]
    .venv/bin/python bench/extproc_chunks.py --callgrind   # instructions per chunk (valgrind)
    .venv/bin/python bench/extproc_chunks.py --per-read 8  # 8 chunks a read, as a busy Envoy sends them

Wall time is the best of ``--repeats`` (µs per chunk). ``--callgrind`` runs this script under
valgrind twice, with no chunks and with ``--chunks``, and reports the difference per chunk: the
instruction count does not move with the other work on a shared machine, so two trees compare exactly
(run each tree's copy of this file with that tree's venv, or ``PYTHONPATH`` at the other tree's
``services/picker/src``).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from hpack import Encoder

from pointsman_picker.extproc.servicer import PROCESS_PATH, ExtProcService, native_methods
from pointsman_picker.extproc.stream import StreamSettings
from pointsman_picker.h2grpc import connection, wire
from pointsman_picker.h2grpc.wire import END_HEADERS, FrameType, Setting
from pointsman_picker.routing import Routing

_MODE = processing_mode_pb2.ProcessingMode
BODY = b'{"model": "tweet-summary", "prompt": "Summarize: points.", "max_tokens": 200, "stream": true}'
# A vLLM SSE event for one token, as Envoy hands it over (one HTTP/1.1 chunk's data).
EVENT = (
    b'data: {"id":"cmpl-bench","object":"text_completion","created":0,"model":"tweet-summary-0",'
    b'"choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null}]}\n\n'
)
BIG_WINDOW = wire.MAX_WINDOW - wire.DEFAULT_WINDOW


class FakeTransport:
    def __init__(self) -> None:
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _headers(pairs: dict[str, str], *, end_of_stream: bool = False) -> pb.HttpHeaders:
    header_map = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    )
    return pb.HttpHeaders(headers=header_map, end_of_stream=end_of_stream)


def messages(chunks: int) -> list[bytes]:
    """The ProcessingRequests of one exchange in the shipped mode, serialized as Envoy sends them."""
    config = pb.ProtocolConfiguration(request_body_mode=_MODE.BUFFERED, response_body_mode=_MODE.STREAMED)
    request_headers = {":method": "POST", ":path": "/v1/completions", "content-type": "application/json"}
    out = [
        pb.ProcessingRequest(request_headers=_headers(request_headers), protocol_config=config),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=BODY, end_of_stream=True)),
        pb.ProcessingRequest(
            response_headers=_headers({":status": "200", "content-type": "text/event-stream"})
        ),
    ]
    out += [pb.ProcessingRequest(response_body=pb.HttpBody(body=EVENT)) for _ in range(chunks)]
    for message in out:
        # Envoy 1.40 sends an (empty) metadata_context with every message.
        message.metadata_context.SetInParent()
    return [m.SerializeToString() for m in out]


def reads(chunks: int, per_read: int = 1) -> list[bytes]:
    """The connection's reads: preface and stream 1's opening, then one message per read (the
    chunks ``per_read`` a read: a busier Envoy's)."""
    preface = (
        wire.PREFACE
        + wire.settings_frame({Setting.INITIAL_WINDOW_SIZE: wire.MAX_WINDOW})
        + wire.window_update(0, BIG_WINDOW)
        + wire.frame(FrameType.SETTINGS, wire.ACK, 0)
    )
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", PROCESS_PATH),
        (":authority", "pointsman-picker"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    opening = wire.frame(FrameType.HEADERS, END_HEADERS, 1, Encoder().encode(fields))
    frames = [wire.frame(FrameType.DATA, 0, 1, wire.grpc_message(m)) for m in messages(chunks)]
    tokens = frames[3:]
    batched = [b"".join(tokens[at : at + per_read]) for at in range(0, len(tokens), per_read)]
    return [preface + opening, *frames[:3], *batched]


def service() -> ExtProcService:
    routing = Routing("10.0.0.1:8000", BODY, rewritten=False, model="tweet-summary", target="tweet-summary-0")
    settings = StreamSettings(
        max_body_bytes=4 << 20,
        destination_header="x-gateway-destination-endpoint",
        metadata_namespace="envoy.lb",
    )
    return ExtProcService(
        lambda _context: routing,
        settings,
        on_error=lambda _error: None,
        on_complete=lambda _done: None,
        on_finish=lambda _routing: None,
        clock=time.perf_counter,
    )


def run(chunks: int, *, feed: bool = True, per_read: int = 1) -> tuple[float, int]:
    """Seconds the chunks took (after the exchange's opening), and the writes made; ``feed=False``
    builds the same bytes and feeds only the opening (callgrind's baseline)."""
    transport = FakeTransport()
    conn = connection.H2Connection(
        {PROCESS_PATH.encode(): native_methods(service())[PROCESS_PATH]},
        max_message_bytes=8 << 20,
        on_close=lambda _: None,
        on_idle=lambda: None,
    )
    conn.connection_made(transport)  # type: ignore[arg-type]
    all_reads = reads(chunks, per_read)
    receive = conn.data_received
    for data in all_reads[:4]:
        receive(data)
    began = time.perf_counter()
    for data in all_reads[4:] if feed else ():
        receive(data)
    return time.perf_counter() - began, transport.writes


def callgrind(chunks: int, per_read: int) -> dict[str, Any]:
    def instructions(feed: bool) -> int:
        argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable]
        argv += [__file__, "--chunks", str(chunks), "--repeats", "1", "--per-read", str(per_read)]
        argv += [] if feed else ["--no-feed"]
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        found = re.search(r"Collected : (\d+)", done.stderr)
        if found is None:
            raise RuntimeError(done.stderr[-2000:])
        return int(found[1])

    none, some = instructions(False), instructions(True)
    return {"chunks": chunks, "per_read": per_read, "instructions_per_chunk": round((some - none) / chunks)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--callgrind", action="store_true", help="instructions per chunk (valgrind)")
    parser.add_argument("--per-read", type=int, default=1, help="chunks a read (Envoy's batches when busy)")
    parser.add_argument("--no-feed", action="store_true", help="build the chunks but do not feed them")
    args = parser.parse_args()
    if args.callgrind:
        print(json.dumps(callgrind(args.chunks, args.per_read)))
        return 0
    best, writes = min(
        run(args.chunks, feed=not args.no_feed, per_read=args.per_read) for _ in range(args.repeats)
    )
    if args.chunks and not args.no_feed:
        result = {
            "chunks": args.chunks,
            "per_read": args.per_read,
            "us_per_chunk": round(best / args.chunks * 1e6, 2),
            "writes": writes,
        }
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
