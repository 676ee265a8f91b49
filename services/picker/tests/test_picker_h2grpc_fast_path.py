"""The HTTP/2 layer's shortcuts answer byte for byte as its whole way does.

A DATA frame holding one whole message goes to its call without the frame handlers
(``H2Protocol._whole_message``), and an answer sent again as the same bytes object is framed once
(``_Stream.answer``). Each case replays the same reads on two connections, one with the shortcut
turned off, and compares everything that comes out: the bytes of every read, what the method was
told, whether the connection closed. A table of the frames the shortcut must leave to the whole way
(flags, splits, windows, closed streams, broken HTTP/2), then hypothesis over sequences of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_picker_h2grpc_protocol import ECHO, Calls, Echo, Frame, Peer, only, parse

from pointsman_picker.h2grpc import wire
from pointsman_picker.h2grpc.calls import ServerStream
from pointsman_picker.h2grpc.limits import Limits
from pointsman_picker.h2grpc.wire import END_HEADERS, END_STREAM, PADDED, FrameType, Setting

ANSWER = b"the same answer every time"


class Constant:
    """Answers every message with the same bytes object (as the ext_proc service answers tokens);
    ``fail`` raises, ``done`` finishes the call."""

    answer = ANSWER

    def __init__(self, calls: Calls, stream: ServerStream) -> None:
        self._calls = calls
        self._stream = stream

    def message(self, payload: bytes) -> None:
        self._calls.messages.append(payload)
        if payload == b"fail":
            raise RuntimeError("the method broke")
        self._stream.send(self.answer)
        if payload == b"done":
            self._stream.finish()

    def half_closed(self) -> None:
        self._calls.half_closed += 1
        self._stream.finish()

    def cancelled(self) -> None:
        self._calls.cancelled += 1


class Fresh(Constant):
    """The same answer, as a new bytes object each time: never the cached frame."""

    def message(self, payload: bytes) -> None:
        self._calls.messages.append(payload)
        if payload == b"fail":
            raise RuntimeError("the method broke")
        self._stream.send(bytes(bytearray(ANSWER)))
        if payload == b"done":
            self._stream.finish()


class Large(Constant):
    """Answers with a long constant (as a routed request's body): framed afresh, never kept."""

    answer = b"b" * 100_000


class Empty(Constant):
    """Answers with the empty message (b"" is one object: the same every time too)."""

    answer = b""


@dataclass
class Replay:
    outputs: list[bytes]
    messages: list[bytes]
    cancelled: int
    half_closed: int
    closing: bool
    queued: int


def replay(
    reads: list[bytes], *, shortcut: bool, method: type = Constant, limits: Limits | None = None
) -> Replay:
    peer = Peer(method=method, limits=limits, max_message_bytes=64)
    if not shortcut:
        # An instance attribute shadows the method: every frame goes the whole way.
        peer.protocol._whole_message = lambda *_: False  # type: ignore[method-assign]
    outputs = []
    for data in [wire.PREFACE + wire.settings_frame({}), *reads]:
        peer.protocol.receive_data(data)
        outputs.append(peer.protocol.data_to_send())
    calls = peer.calls
    return Replay(
        outputs,
        calls.messages,
        calls.cancelled,
        calls.half_closed,
        peer.protocol.closing,
        peer.protocol.queued_bytes,
    )


def assert_same(reads: list[bytes], **kwargs: object) -> Replay:
    fast, whole = replay(reads, shortcut=True, **kwargs), replay(reads, shortcut=False, **kwargs)  # type: ignore[arg-type]
    assert fast == whole
    return fast


def block() -> bytes:
    """The request's header block from an encoder of its own: literals any connection decodes."""
    return Peer().block(ECHO)


def opening(stream_id: int) -> bytes:
    return wire.frame(FrameType.HEADERS, END_HEADERS, stream_id, block())


def message(stream_id: int, payload: bytes, *, flags: int = 0) -> bytes:
    return wire.frame(FrameType.DATA, flags, stream_id, wire.grpc_message(payload))


def data(stream_id: int, payload: bytes, *, flags: int = 0) -> bytes:
    return wire.frame(FrameType.DATA, flags, stream_id, payload)


HALF = wire.grpc_message(b"split in two")
CASES = {
    "one message a frame, one frame a read": [opening(1), message(1, b"a"), message(1, b"b")],
    "frames of several streams in one read": [opening(1) + opening(3) + message(1, b"a") + message(3, b"b")],
    "a message split across frames": [opening(1), data(1, HALF[:7]), data(1, HALF[7:])],
    "a frame split across reads": [opening(1), message(1, b"cut")[:12], message(1, b"cut")[12:]],
    "two messages in one frame": [opening(1), data(1, wire.grpc_message(b"a") + wire.grpc_message(b"b"))],
    "a whole message then the start of the next": [opening(1), data(1, wire.grpc_message(b"a") + HALF[:7])],
    "the end of the stream with its message": [opening(1), message(1, b"last", flags=END_STREAM)],
    "a padded frame": [opening(1), data(1, b"\x02" + wire.grpc_message(b"pad") + b"\0\0", flags=PADDED)],
    "a compressed message": [opening(1), data(1, b"\x01" + wire.grpc_message(b"z")[1:])],
    "a message over the cap": [opening(1), message(1, b"x" * 65)],
    "a prefix that says more than the frame holds": [opening(1), data(1, b"\0\0\0\0\x09abc")],
    "a frame shorter than a prefix": [opening(1), data(1, b"\0\0")],
    "an empty frame": [opening(1), data(1, b"")],
    "an empty message": [opening(1), message(1, b""), message(1, b"")],
    "a method that raises": [opening(1), message(1, b"fail"), message(1, b"after")],
    "a method that finishes on a message": [opening(1), message(1, b"done"), message(1, b"after")],
    "a message after the end of the stream": [
        opening(1),
        message(1, b"a", flags=END_STREAM),
        message(1, b"b"),
    ],
    "a message on a reset stream": [
        opening(1),
        wire.rst_stream(1, wire.ErrorCode.CANCEL),
        message(1, b"late"),
    ],
    "a message on an idle stream": [opening(1), message(5, b"idle")],
    "a message on stream 0": [message(0, b"zero")],
    "DATA inside a header block": [
        wire.frame(FrameType.HEADERS, 0, 1, block()),
        message(1, b"in the middle"),
    ],
    "messages past the stream's window": [opening(1), *(message(1, b"w" * 60) for _ in range(3))],
}


@pytest.mark.parametrize("reads", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("method", [Constant, Fresh, Empty, Large, Echo])
def test_the_shortcut_answers_as_the_whole_way_does(reads, method):
    # A stream window of 128 bytes: "past the stream's window" passes it on the third message.
    assert_same(reads, method=method, limits=Limits(initial_window_size=128))


def test_windows_come_back_as_the_whole_way_returns_them():
    # Half the stream window consumed: the stream's WINDOW_UPDATE goes out, from either way.
    reads = [opening(1), *(message(1, b"m" * 50) for _ in range(4))]
    out = assert_same(reads, limits=Limits(initial_window_size=200))
    assert wire.frame_header(out.outputs[-1], 0)[1] == FrameType.DATA
    assert any(wire.window_update(1, 110) in output for output in out.outputs)


def test_answers_wait_for_the_peers_window_either_way():
    # The peer grants 40 bytes a stream: the second answer waits, then a WINDOW_UPDATE lets it go.
    reads = [
        wire.settings_frame({Setting.INITIAL_WINDOW_SIZE: 40}),
        opening(1),
        message(1, b"a"),
        message(1, b"b"),
        wire.window_update(1, 100),
        message(1, b"c"),
    ]
    out = assert_same(reads)
    assert out.queued == 0


@pytest.mark.parametrize("method", [Constant, Empty])
def test_the_cached_frame_is_the_frame_built_afresh(method):
    reads = [opening(1), opening(3), message(1, b"a"), message(3, b"b"), message(1, b"c"), message(3, b"d")]
    out = replay(reads, shortcut=True, method=method)
    answers = [only(parse(output), FrameType.DATA) for output in out.outputs[3:]]
    assert answers == [[Frame(FrameType.DATA, 0, s, wire.grpc_message(method.answer))] for s in (1, 3, 1, 3)]


# -- hypothesis ---------------------------------------------------------------------------------------
streams = st.sampled_from([1, 3, 5])
payloads = st.one_of(st.binary(max_size=70), st.sampled_from([b"fail", b"done"]))
frames = st.one_of(
    st.builds(opening, streams),
    st.builds(message, streams, payloads, flags=st.sampled_from([0, 0, 0, END_STREAM, PADDED])),
    st.builds(data, streams, st.binary(max_size=12), flags=st.sampled_from([0, END_STREAM])),
    st.builds(wire.window_update, st.sampled_from([0, 1, 3]), st.integers(1, 200)),
    st.builds(lambda s: wire.rst_stream(s, wire.ErrorCode.CANCEL), streams),
    st.builds(lambda v: wire.settings_frame({Setting.INITIAL_WINDOW_SIZE: v}), st.integers(0, 300)),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(frames, max_size=25),
    st.lists(st.integers(1, 400), max_size=8),
    st.sampled_from([Constant, Echo]),
)
def test_any_frames_cut_into_any_reads_come_out_the_same(sequence, cuts, method):
    stream = b"".join(sequence)
    reads, at = [], 0
    for cut in cuts:
        reads.append(stream[at : at + cut])
        at += cut
    reads.append(stream[at:])
    assert_same(reads, method=method, limits=Limits(initial_window_size=160))


@pytest.mark.parametrize(("method", "kept"), [(Constant, True), (Large, False)])
def test_only_a_short_answer_is_kept_framed_by_its_stream(method, kept):
    # Streams live as long as their response: a routed body kept framed would be held that long.
    peer = Peer(method=method)
    peer.connect()
    peer.send(opening(1), message(1, b"a"))
    assert (peer.protocol._streams[1].answer is not None) is kept
