"""What the native gRPC server's hot path costs without a socket: ext_proc-shaped HTTP/2 bytes fed to
one connection, the method answering each message at once.

Two shapes, each timed as the best of several repeats (per unit, after a warm-up):

- ``message``: one open stream, one DATA frame carrying one gRPC message per read, one DATA frame
  answered per read (the steady part of an ext_proc stream);
- ``stream``: whole streams as Envoy sends them with FULL_DUPLEX_STREAMED bodies: HEADERS + the
  request-headers message, then the body message, then an empty END_STREAM DATA frame and RST_STREAM
  in one read (Envoy's way of ending each ext_proc stream).

Each is run through ``connection.H2Connection`` (the asyncio Protocol the server uses) on a fake
transport, and, where the tree has it, through the sans-IO ``protocol.H2Protocol`` alone. The request
bytes are built beforehand with ``hpack``'s encoder (its dynamic table as a real client's), so the
timed loop is the server's work only.

    .venv/bin/python bench/h2grpc_protocol.py [--repeats 40] [--against CONNECTION_PY]
        [--against-package H2GRPC_DIR] [--json]

To compare with another version of ``connection.py`` (the code before a change, say), give its file:
it is loaded beside this tree's (with this tree's ``wire.py``) and the two take turns, repeat by
repeat, in one process, so that a machine shared with other work slows both alike:

    git show HEAD:services/picker/src/pointsman_picker/h2grpc/connection.py > /tmp/connection_before.py
    .venv/bin/python bench/h2grpc_protocol.py --against /tmp/connection_before.py

Since the sans-IO split the work is in ``protocol.py`` (and ``wire.py``), which an older
``connection.py`` would import from this tree: give a copy of the whole older package instead, and
its ``connection.H2Connection`` and ``protocol.H2Protocol`` are timed beside this tree's (``before.*``):

    mkdir /tmp/h2grpc_before && git archive HEAD services/picker/src/pointsman_picker/h2grpc \\
        | tar -x --strip-components=5 -C /tmp/h2grpc_before
    .venv/bin/python bench/h2grpc_protocol.py --against-package /tmp/h2grpc_before
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from hpack import Encoder

from pointsman_picker.h2grpc import connection, wire
from pointsman_picker.h2grpc.wire import END_HEADERS, END_STREAM, ErrorCode, FrameType, Setting

PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
HEADERS_MESSAGE = b"h" * 300  # a ProcessingRequest with request headers, about this size
BODY_MESSAGE = b"b" * 1_100  # one with a ~1 KB JSON body
ANSWER = b"a" * 120  # a ProcessingResponse with a header mutation and the route's metadata
# Short runs, many of them: the best of many short turns finds the machine's quiet moments.
MESSAGES = 2_000
STREAMS = 1_000
BIG_WINDOW = wire.MAX_WINDOW - wire.DEFAULT_WINDOW


class Answer:
    """The method: answers each message with one fixed message, ends the call on the half-close."""

    __slots__ = ("_stream",)

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def message(self, payload: bytes) -> None:
        self._stream.send(ANSWER)

    def half_closed(self) -> None:
        self._stream.finish()

    def cancelled(self) -> None:
        pass


class FakeTransport:
    """Just enough of an asyncio transport; counts what it is given."""

    def __init__(self) -> None:
        self.written = 0
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)
        self.writes += 1

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def client_preface() -> bytes:
    # Envoy opens wide windows, so answers never wait for WINDOW_UPDATE.
    return (
        wire.PREFACE
        + wire.settings_frame({Setting.INITIAL_WINDOW_SIZE: wire.MAX_WINDOW})
        + wire.window_update(0, BIG_WINDOW)
        + wire.frame(FrameType.SETTINGS, wire.ACK, 0)
    )


def request_headers(encoder: Encoder) -> bytes:
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", PROCESS),
        (":authority", "pointsman-picker"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("grpc-timeout", "200m"),
        ("x-envoy-internal", "true"),
        ("x-forwarded-for", "10.0.0.7"),
    ]
    block: bytes = encoder.encode(fields)
    return block


def message_reads() -> list[bytes]:
    """Stream 1 opened, then one message per read."""
    encoder = Encoder()
    opening = wire.frame(FrameType.HEADERS, END_HEADERS, 1, request_headers(encoder))
    one = wire.frame(FrameType.DATA, 0, 1, wire.grpc_message(BODY_MESSAGE))
    return [client_preface() + opening] + [one] * MESSAGES


def stream_reads() -> list[bytes]:
    """Envoy's three reads per ext_proc stream, stream after stream."""
    encoder = Encoder()
    reads = [client_preface()]
    for stream_id in range(1, 2 * STREAMS, 2):
        headers = wire.frame(FrameType.HEADERS, END_HEADERS, stream_id, request_headers(encoder))
        reads.append(headers + wire.frame(FrameType.DATA, 0, stream_id, wire.grpc_message(HEADERS_MESSAGE)))
        reads.append(wire.frame(FrameType.DATA, 0, stream_id, wire.grpc_message(BODY_MESSAGE)))
        reads.append(
            wire.frame(FrameType.DATA, END_STREAM, stream_id) + wire.rst_stream(stream_id, ErrorCode.CANCEL)
        )
    return reads


Feeder = Callable[[dict[bytes, Any]], tuple[Callable[[bytes], None], Callable[[], int]]]


def adapter_feeder(module: ModuleType) -> Feeder:
    def feeder(methods: dict[bytes, Any]) -> tuple[Callable[[bytes], None], Callable[[], int]]:
        transport = FakeTransport()
        conn = module.H2Connection(
            methods, max_message_bytes=8 * 1024 * 1024, on_close=lambda _: None, on_idle=lambda: None
        )
        conn.connection_made(transport)
        return conn.data_received, lambda: transport.writes

    return feeder


def protocol_feeder(protocol_module: ModuleType) -> Feeder:
    def feeder(methods: dict[bytes, Any]) -> tuple[Callable[[bytes], None], Callable[[], int]]:
        protocol = protocol_module.H2Protocol(methods, max_message_bytes=8 * 1024 * 1024)
        receive, to_send = protocol.receive_data, protocol.data_to_send
        sent = [0]
        to_send()

        def feed(data: bytes) -> None:
            receive(data)
            if to_send():
                sent[0] += 1

        return feed, lambda: sent[0]

    return feeder


def load_package(directory: str) -> tuple[ModuleType, ModuleType]:
    """An older copy of the h2grpc package, importable beside this tree's: its connection and protocol."""
    root = Path(tempfile.mkdtemp(prefix="h2grpc_bench_"))
    package = root / "h2grpc_before"
    package.mkdir()
    for source in Path(directory).glob("*.py"):
        text = source.read_text().replace("pointsman_picker.h2grpc", "h2grpc_before")
        (package / source.name).write_text(text)
    if not (package / "__init__.py").exists():
        (package / "__init__.py").write_text("")
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module("h2grpc_before.connection"), importlib.import_module(
            "h2grpc_before.protocol"
        )
    finally:
        sys.path.remove(str(root))
        shutil.rmtree(root, ignore_errors=True)


def run_once(feeder: Feeder, reads: list[bytes], units: int) -> tuple[float, int]:
    """µs per unit of one run, and the writes it made."""
    feed, count = feeder({PROCESS.encode(): Answer})
    feed(reads[0])
    gc.collect()
    gc.disable()
    start = time.perf_counter()
    for data in reads[1:]:
        feed(data)
    elapsed = time.perf_counter() - start
    gc.enable()
    return elapsed / units * 1e6, count()


def load_other(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("other_h2grpc_connection", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--against", metavar="CONNECTION_PY", help="another connection.py, timed in turns")
    parser.add_argument(
        "--against-package", metavar="H2GRPC_DIR", help="a copy of another h2grpc package, timed in turns"
    )
    parser.add_argument("--json", action="store_true", help="one JSON line instead of text")
    args = parser.parse_args()
    feeders: dict[str, Feeder] = {"connection": adapter_feeder(connection)}
    if args.against:
        feeders["against"] = adapter_feeder(load_other(args.against))
    if importlib.util.find_spec("pointsman_picker.h2grpc.protocol") is not None:  # since the sans-IO split
        feeders["protocol"] = protocol_feeder(importlib.import_module("pointsman_picker.h2grpc.protocol"))
    if args.against_package:
        before_connection, before_protocol = load_package(args.against_package)
        feeders["before.connection"] = adapter_feeder(before_connection)
        feeders["before.protocol"] = protocol_feeder(before_protocol)
    shapes = {"message": (message_reads(), MESSAGES), "stream": (stream_reads(), STREAMS)}
    results: dict[str, float] = {}
    for shape, (reads, units) in shapes.items():
        best = dict.fromkeys(feeders, float("inf"))
        writes = dict.fromkeys(feeders, 0)
        for repeat in range(args.repeats + 1):  # the first turn warms up
            # In turns, the order flipped each time: what slows the machine slows each alike.
            turn = list(feeders.items())
            for name, feeder in turn if repeat % 2 else reversed(turn):
                us, writes[name] = run_once(feeder, reads, units)
                if repeat:
                    best[name] = min(best[name], us)
        for name in feeders:
            results[f"{name}.{shape}"] = round(best[name], 3)
            if not args.json:
                print(f"{name:>17} {shape:>8}: {best[name]:7.3f} µs per {shape}  ({writes[name]} writes)")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
