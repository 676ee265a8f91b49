"""The sending direction (``h2grpc/send_scheduler.py``): DATA frames within the peer's windows and frame
size, who waits on which window, and what a WINDOW_UPDATE or SETTINGS lets go."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import pytest

from pointsman_picker.h2grpc import wire
from pointsman_picker.h2grpc.send_scheduler import SendScheduler
from pointsman_picker.h2grpc.wire import ErrorCode, FrameType, H2ConnectionError


@dataclass
class Stream:
    id: int
    outbox: deque[bytes] = field(default_factory=deque)
    queued: int = 0
    send_delta: int = 0


class Wire:
    """The frames written, as (stream, payload size)."""

    def __init__(self) -> None:
        self.frames: list[tuple[int, int]] = []

    def write(self, data: bytes) -> None:
        length, kind, _flags, stream_id = wire.frame_header(data, 0)
        assert kind == FrameType.DATA
        assert len(data) == wire.FRAME_HEADER_BYTES + length
        self.frames.append((stream_id, length))


def scheduler(
    *, window: int = wire.DEFAULT_WINDOW, initial: int = wire.DEFAULT_WINDOW, max_queued: int = 10**6
) -> tuple[SendScheduler[Stream], Wire]:
    out = Wire()
    sending: SendScheduler[Stream] = SendScheduler(out.write, max_queued_bytes=max_queued)
    sending.window = window
    sending.peer_initial = initial
    return sending, out


@pytest.mark.parametrize(
    ("window", "initial", "max_frame", "message", "frames", "left"),
    [
        (100_000, 100_000, 16_384, 1000, [1000], 0),
        (100_000, 100_000, 16_384, 40_000, [16_384, 16_384, 7232], 0),  # cut to the peer's frame size
        (100_000, 500, 16_384, 1000, [500], 500),  # the stream's window ran out
        (300, 100_000, 16_384, 1000, [300], 700),  # the connection's ran out
        (0, 100_000, 16_384, 1000, [], 1000),
        (100_000, 0, 16_384, 1000, [], 1000),
    ],
)
def test_a_message_goes_out_as_far_as_the_windows_allow(
    window: int, initial: int, max_frame: int, message: int, frames: list[int], left: int
) -> None:
    sending, out = scheduler(window=window, initial=initial)
    sending.max_frame = max_frame
    stream = Stream(1)
    assert not sending.send(stream, b"m" * message)
    assert out.frames == [(1, size) for size in frames]
    assert (stream.queued, sending.queued) == (left, left)
    assert sum(len(chunk) for chunk in stream.outbox) == left
    assert sending.window == window - sum(frames)
    assert stream.send_delta == -sum(frames)


def test_a_message_behind_one_waiting_waits_and_is_counted() -> None:
    sending, out = scheduler(window=0)
    stream = Stream(1)
    sending.send(stream, b"a" * 10)
    sending.send(stream, b"b" * 20)
    assert out.frames == []
    assert (stream.queued, sending.queued, len(stream.outbox)) == (30, 30, 2)


@pytest.mark.parametrize(("sizes", "too_much"), [([400, 500], [False, False]), ([400, 601], [False, True])])
def test_too_much_waiting_for_a_peer_that_grants_no_window(sizes: list[int], too_much: list[bool]) -> None:
    sending, _ = scheduler(window=0, max_queued=1000)
    assert [sending.send(Stream(i), b"x" * size) for i, size in enumerate(sizes)] == too_much


def test_a_connection_window_update_lets_go_the_streams_waiting_on_it_oldest_first() -> None:
    sending, out = scheduler(window=0)
    streams = [Stream(stream_id) for stream_id in (5, 1, 3)]
    for stream in streams:
        sending.send(stream, b"x" * 100)
    own = Stream(7, send_delta=-wire.DEFAULT_WINDOW)  # waiting on its own window: not let go here
    sending.send(own, b"x" * 100)
    let_go = []
    for stream in sending.grow_connection(150):  # each drained before the next is asked for
        let_go.append(stream.id)
        sending.drain(stream)
    assert let_go == [5, 1]  # the window ran out on the second
    assert out.frames == [(5, 100), (1, 50)]
    # 1 had not finished: it waits again, behind 3 (each stream takes its turn).
    assert [stream.id for stream in sending.grow_connection(1000)] == [3, 1]


def test_connection_window_overflow() -> None:
    sending, _ = scheduler(window=wire.MAX_WINDOW)
    with pytest.raises(H2ConnectionError) as raised:
        list(sending.grow_connection(1))
    assert raised.value.code is ErrorCode.FLOW_CONTROL_ERROR


@pytest.mark.parametrize(
    ("initial", "delta", "increment", "grows"),
    [
        (wire.DEFAULT_WINDOW, 0, 100, True),
        (wire.DEFAULT_WINDOW, 0, wire.MAX_WINDOW - wire.DEFAULT_WINDOW, True),
        (wire.DEFAULT_WINDOW, 0, wire.MAX_WINDOW - wire.DEFAULT_WINDOW + 1, False),  # overflow
        (0, -10, wire.MAX_WINDOW + 10, True),
    ],
)
def test_a_stream_window_update(initial: int, delta: int, increment: int, grows: bool) -> None:
    sending, _ = scheduler(initial=initial)
    assert sending.grow_stream(Stream(1, send_delta=delta), increment) is grows


def test_a_stream_window_update_lets_that_stream_go_only_if_it_waited_on_it() -> None:
    sending, _ = scheduler()
    waiting, idle = Stream(1, send_delta=-wire.DEFAULT_WINDOW), Stream(3)
    sending.send(waiting, b"x")
    assert sending.grow_stream(waiting, 10)
    assert sending.unblock(waiting)
    assert not sending.unblock(waiting)  # let go once
    assert not sending.unblock(idle)


@pytest.mark.parametrize(
    ("before", "value", "deltas", "grew", "error"),
    [
        (wire.DEFAULT_WINDOW, 70_000, [0], True, None),
        (wire.DEFAULT_WINDOW, 1000, [0], False, None),
        (wire.DEFAULT_WINDOW, wire.MAX_WINDOW + 1, [0], False, "initial window too large"),
        (wire.DEFAULT_WINDOW, wire.MAX_WINDOW, [0, 1], False, "a stream window overflows"),
        (wire.DEFAULT_WINDOW, wire.MAX_WINDOW, [0, -5], True, None),
    ],
)
def test_the_peers_initial_window(
    before: int, value: int, deltas: list[int], grew: bool, error: str | None
) -> None:
    sending, _ = scheduler(initial=before)
    streams = [Stream(2 * i + 1, send_delta=delta) for i, delta in enumerate(deltas)]
    for stream in streams:  # their windows' updates make the largest delta known
        sending.grow_stream(stream, 0)
    if error is None:
        assert sending.set_initial_window(value, streams) is grew
        assert sending.peer_initial == value
        return
    with pytest.raises(H2ConnectionError, match=error) as raised:
        sending.set_initial_window(value, streams)
    assert raised.value.code is ErrorCode.FLOW_CONTROL_ERROR


def test_a_stream_window_once_large_and_since_spent_is_no_overflow() -> None:
    # The largest delta seen is an upper bound: the exact one is found before calling it an overflow.
    sending, _ = scheduler(initial=0)
    stream = Stream(1)
    sending.grow_stream(stream, 1000)
    stream.send_delta = 0  # spent
    assert sending.set_initial_window(wire.MAX_WINDOW, [stream])


@pytest.mark.parametrize(
    ("value", "allowed"),
    [(wire.DEFAULT_MAX_FRAME, True), (2**24 - 1, True), (wire.DEFAULT_MAX_FRAME - 1, False), (2**24, False)],
)
def test_the_peers_max_frame_size(value: int, allowed: bool) -> None:
    sending, _ = scheduler()
    if allowed:
        sending.set_max_frame(value)
        assert sending.max_frame == value
        return
    with pytest.raises(H2ConnectionError, match="bad MAX_FRAME_SIZE"):
        sending.set_max_frame(value)


def test_a_settings_change_lets_go_every_stream_waiting_on_its_own_window_once() -> None:
    sending, _ = scheduler(initial=0)
    streams = [Stream(1), Stream(3)]
    for stream in streams:
        sending.send(stream, b"x")
    assert list(sending.take_stream_blocked()) == streams
    assert list(sending.take_stream_blocked()) == []


def test_a_stream_forgotten_drops_what_it_queued() -> None:
    sending, _ = scheduler(window=0)
    stream, other = Stream(1), Stream(3)
    sending.send(stream, b"x" * 100)
    sending.send(other, b"y" * 10)
    sending.forget(stream)
    assert (sending.queued, stream.queued, len(stream.outbox)) == (10, 0, 0)
    assert [s.id for s in sending.grow_connection(1000)] == [3]
