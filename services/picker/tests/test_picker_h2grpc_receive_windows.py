"""The receiving direction's windows (``h2grpc/receive_windows.py``): what goes back, and when."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from pointsman_picker.h2grpc.limits import Limits
from pointsman_picker.h2grpc.receive_windows import RECEIVE_WINDOW, ReceiveWindows
from pointsman_picker.h2grpc.wire import ErrorCode, H2ConnectionError

WINDOW = 1000  # each stream's initial window in these tables
LIMITS = Limits(initial_window_size=WINDOW, max_buffered_bytes=5000)


@dataclass
class Stream:
    recv_window: int = WINDOW
    reserved: int = 0
    inbox: bytearray = field(default_factory=bytearray)


@pytest.mark.parametrize(
    ("reads", "increments"),
    [
        ([100, 200], [0, 0]),
        ([RECEIVE_WINDOW // 2 - 1, 1], [0, RECEIVE_WINDOW // 2]),  # half due: all of it goes back
        ([RECEIVE_WINDOW // 2, 10], [RECEIVE_WINDOW // 2, 0]),  # and counting starts again
        ([0, 0], [0, 0]),
    ],
)
def test_the_connection_window_goes_back_once_half_is_due(reads: list[int], increments: list[int]) -> None:
    windows = ReceiveWindows(LIMITS)
    assert [windows.connection_read(size) for size in reads] == increments


def test_data_past_the_connection_window_is_a_connection_error() -> None:
    windows = ReceiveWindows(LIMITS)
    with pytest.raises(H2ConnectionError) as raised:
        windows.connection_read(RECEIVE_WINDOW + 1)
    assert raised.value.code is ErrorCode.FLOW_CONTROL_ERROR


@pytest.mark.parametrize(
    ("window", "size", "allowed", "left"),
    [(WINDOW, 10, True, WINDOW - 10), (10, 10, True, 0), (10, 11, False, 10), (0, 0, True, 0)],
)
def test_a_stream_read_within_its_window(window: int, size: int, allowed: bool, left: int) -> None:
    stream = Stream(recv_window=window)
    assert ReceiveWindows.stream_read(stream, size) is allowed
    assert stream.recv_window == left


@pytest.mark.parametrize(
    ("stream", "grant"),
    [
        # Nothing held: what was consumed goes back once half the window is due.
        (Stream(recv_window=WINDOW), 0),
        (Stream(recv_window=WINDOW // 2 + 1), 0),
        (Stream(recv_window=WINDOW // 2), WINDOW // 2),
        (Stream(recv_window=0), WINDOW),
        # Part of a message held: the window is the initial one less what is held...
        (Stream(recv_window=WINDOW - 600, reserved=0, inbox=bytearray(4)), WINDOW - 4 - 400),
        (Stream(recv_window=WINDOW - 300, reserved=0, inbox=bytearray(200)), 0),  # 100 due: not yet
        # ... or opened to the rest of an announced message, whatever half says.
        (Stream(recv_window=50, reserved=3000, inbox=bytearray(900)), 3000 - 900 - 50),
        (Stream(recv_window=2100, reserved=3000, inbox=bytearray(900)), 0),  # the rest may come already
    ],
)
def test_what_goes_back_to_a_stream_after_data(stream: Stream, grant: int) -> None:
    window = stream.recv_window
    assert ReceiveWindows(LIMITS).stream_grant(stream) == grant
    assert stream.recv_window == window + grant


@pytest.mark.parametrize(
    ("holds", "allowed", "held"),
    [
        # (stream index, the size of the message it has begun) in turn
        ([(0, 3000), (1, 2000)], [True, True], 5000),
        ([(0, 3000), (1, 2001)], [True, False], 3000),  # past the budget: refused, nothing counted
        ([(0, 3000), (0, 4000)], [True, True], 4000),  # the same stream's message grows its count
        ([(0, 3000), (0, 0), (1, 5000)], [True, True, True], 5000),  # finished: the bytes are free
        ([(0, 9000)], [True], 9000),  # one message alone always fits
    ],
)
def test_held_bytes_within_the_budget(holds: list[tuple[int, int]], allowed: list[bool], held: int) -> None:
    windows = ReceiveWindows(LIMITS)
    streams = [Stream(), Stream()]
    assert [windows.hold(streams[i], pending) for i, pending in holds] == allowed
    assert windows.held == held == sum(stream.reserved for stream in streams)


def test_a_released_stream_gives_its_held_bytes_back() -> None:
    windows = ReceiveWindows(LIMITS)
    stream = Stream()
    windows.hold(stream, 3000)
    windows.release(stream)
    windows.release(stream)  # twice is once
    assert (windows.held, stream.reserved) == (0, 0)
