"""Coverage-guided fuzz targets (atheris) for the native gRPC server's parsers: the frame decoder (the
sans-IO protocol fed arbitrary bytes after a valid preface), the HPACK decoder, and the gRPC
message/body parser (DATA payloads on an open stream).

Each target's contract: any input ends in a clean answer; the only exception allowed out of the
HPACK decoder is ``H2ConnectionError``; the protocol never raises, never logs "unexpected error"
(a bug turned into GOAWAY INTERNAL_ERROR fails the target too), and keeps its bounds.

    .venv/bin/python bench/fuzz/targets.py frames -max_total_time=60      # one target, libFuzzer flags
    make fuzz FUZZ_SECONDS=60                                             # every target in turn

``run(target, data)`` runs one input without atheris (the tests replay the seeds and any crash
files through it).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

if __name__ == "__main__":  # instrument the server's modules as they load, and only those
    import atheris

    with atheris.instrument_imports(include=["pointsman_picker.h2grpc"]):
        import pointsman_picker.h2grpc.protocol  # noqa: F401

from pointsman_picker.h2grpc import wire
from pointsman_picker.h2grpc.calls import ServerStream
from pointsman_picker.h2grpc.limits import Limits
from pointsman_picker.h2grpc.protocol import H2Protocol
from pointsman_picker.h2grpc.wire import END_HEADERS, FrameType, H2ConnectionError

PATH = b"/fuzz.Echo/Echo"
LIMITS = Limits(max_concurrent_streams=8, max_buffered_bytes=64 * 1024, max_queued_bytes=64 * 1024)
_REQUEST = (
    wire.encode_literal(2, b"POST")
    + wire.encode_literal(6, b"http")
    + wire.encode_literal(4, PATH)
    + wire.encode_literal(b"te", b"trailers")
)


class _Unexpected(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR and "unexpected" in record.getMessage():
            raise AssertionError(record.getMessage()) from None


class _Echo:
    def __init__(self, stream: ServerStream) -> None:
        self._stream = stream

    def message(self, payload: bytes) -> None:
        if payload[:1] == b"!":
            raise RuntimeError("a method failing is the method's business")
        self._stream.send(payload[:64])

    def half_closed(self) -> None:
        self._stream.finish()

    def cancelled(self) -> None:
        pass


def _protocol() -> H2Protocol:
    protocol = H2Protocol({PATH: _Echo}, max_message_bytes=32 * 1024, limits=LIMITS, clock=lambda: 0.0)
    protocol.data_to_send()
    return protocol


def _check(protocol: H2Protocol) -> None:
    assert protocol.open_streams <= LIMITS.max_concurrent_streams
    assert protocol._receiving.held <= LIMITS.max_buffered_bytes + 32 * 1024 + 5
    assert protocol._sending.queued <= LIMITS.max_queued_bytes + 64 + 5 or protocol.closing
    protocol.data_to_send()


def frames(data: bytes) -> None:
    """Arbitrary bytes after the preface and an empty SETTINGS, in reads cut where the input says."""
    protocol = _protocol()
    protocol.receive_data(wire.PREFACE + wire.settings_frame({}))
    cut = data[0] if data else 0
    rest = data[1:]
    step = max(cut, 1) if cut < 128 else len(rest) or 1
    for at in range(0, len(rest), step):
        protocol.receive_data(rest[at : at + step])
        while protocol.backlog:
            protocol.receive_data(b"")
        _check(protocol)


def hpack(data: bytes) -> None:
    """Header blocks (split at 0xFE bytes) through one decoder: a table shared across them."""
    decoder = wire.HeaderDecoder(max_list_size=LIMITS.max_header_list_size)
    for block in data.split(b"\xfe"):
        try:
            fields = decoder.decode(block)
        except H2ConnectionError:
            return
        assert not (decoder.oversized and fields)
        assert sum(len(n) + len(v) + 32 for n, v in fields) <= LIMITS.max_header_list_size


def body(data: bytes) -> None:
    """DATA payloads on stream 1 (opened with a request for the echo method), split at 0xFE bytes; the
    last ends the stream."""
    protocol = _protocol()
    protocol.receive_data(
        wire.PREFACE + wire.settings_frame({}) + wire.frame(FrameType.HEADERS, END_HEADERS, 1, _REQUEST)
    )
    chunks = data.split(b"\xfe")
    for index, chunk in enumerate(chunks):
        last = index == len(chunks) - 1
        protocol.receive_data(wire.frame(FrameType.DATA, wire.END_STREAM if last else 0, 1, chunk))
        _check(protocol)


TARGETS: dict[str, Callable[[bytes], None]] = {"frames": frames, "hpack": hpack, "body": body}


def run(target: str, data: bytes) -> None:
    handler = _Unexpected()
    logger = logging.getLogger("pointsman_picker.h2grpc")
    logger.addHandler(handler)
    try:
        TARGETS[target](data)
    finally:
        logger.removeHandler(handler)


def main() -> None:
    import atheris

    target = sys.argv[1]
    logging.getLogger("pointsman_picker.h2grpc").setLevel(logging.ERROR)
    atheris.Setup([sys.argv[0], *sys.argv[2:]], lambda data: run(target, data))
    atheris.Fuzz()


if __name__ == "__main__":
    main()
