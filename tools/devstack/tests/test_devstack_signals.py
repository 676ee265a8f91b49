from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from pointsman_devstack.signals import STOP_SIGNALS, StopSignals


class _Stack:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def cancel(self) -> None:
        self.calls.append("cancel")

    def hurry(self) -> None:
        self.calls.append("hurry")


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def notices() -> Iterator[tuple[int, int]]:
    read, write = os.pipe()
    yield read, write
    os.close(read)
    os.close(write)


@pytest.mark.parametrize(
    ("second_after", "calls"),
    [
        pytest.param(0.0, ["cancel"], id="same-moment-is-the-same-request"),
        pytest.param(0.9, ["cancel"], id="within-the-window"),
        pytest.param(1.0, ["cancel", "hurry"], id="later-hurries"),
    ],
)
def test_a_second_signal_is_ignored_at_once_and_hurries_later(
    notices: tuple[int, int], second_after: float, calls: list[str]
) -> None:
    stack, clock = _Stack(), _Clock()
    signals = StopSignals(stack, clock=clock, notice_fd=notices[1])
    signals.handle(signal.SIGTERM)
    clock.now += second_after
    signals.handle(signal.SIGTERM)
    assert stack.calls == calls
    assert signals.received == signal.SIGTERM
    assert signals.hurried is (calls[-1] == "hurry")


def test_every_later_signal_hurries_and_one_notice_says_so(notices: tuple[int, int]) -> None:
    stack, clock = _Stack(), _Clock()
    signals = StopSignals(stack, clock=clock, notice_fd=notices[1])
    signals.handle(signal.SIGINT)
    for _ in range(3):
        clock.now += 2
        signals.handle(signal.SIGINT)
    assert stack.calls == ["cancel", "hurry", "hurry", "hurry"]
    assert os.read(notices[0], 1000) == b"pointsman-stack: SIGINT again: killing what is still running\n"


def test_real_signals_set_the_flags_and_the_old_handlers_come_back() -> None:
    before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    stack = _Stack()
    with StopSignals(stack) as signals:
        for signum in STOP_SIGNALS:
            assert signal.getsignal(signum) == signals.handle
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGHUP)  # within the window: the same request
    assert stack.calls == ["cancel"]
    assert signals.received == signal.SIGTERM
    assert {signum: signal.getsignal(signum) for signum in STOP_SIGNALS} == before
