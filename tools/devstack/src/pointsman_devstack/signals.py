"""The stop signals of ``pointsman-stack``: installed once, before anything starts, until all stopped.

SIGINT (Ctrl-C), SIGTERM and SIGHUP (the terminal closed) all stop the stack. The handler never raises
and takes no lock: it runs between two bytecodes of whatever the main thread is doing, which may hold
any lock (``threading.Event`` uses a plain one) or be half-way through a ``Popen``, and an exception
raised there, as ``KeyboardInterrupt`` is, can land between a child's start and its bookkeeping and
lose it. It only sets flags the stack polls (:meth:`Stack.cancel`, :meth:`Stack.hurry`):

- the first signal asks the stack to stop: a start under way gives up at its next poll, a running
  stack leaves its watch loop, and the stop follows in the main thread, every child in order;
- a signal within ``same_within`` seconds of the first is the same request arriving twice and is
  ignored: ``kill -TERM -- -PGID`` under make reaches the stack directly and once more through make,
  which forwards SIGTERM to its children;
- a later one hurries the stop: each process still stopping gets SIGKILL at once (and so on for each
  one after). Nothing is abandoned either way: the main thread is still stopping them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, Protocol

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# kill -TERM -- -PGID under make: the two copies land microseconds apart; a person pressing Ctrl-C again
# because the stop is slow takes longer than this.
SAME_REQUEST_WITHIN = 1.0


class Stoppable(Protocol):
    def cancel(self) -> None: ...

    def hurry(self) -> None: ...


class StopSignals:
    """``with StopSignals(stack):`` the stop signals set ``stack``'s flags; the old handlers come back
    on exit. ``received`` is the first signal's number (None before any)."""

    def __init__(
        self,
        stack: Stoppable,
        *,
        same_within: float = SAME_REQUEST_WITHIN,
        clock: Callable[[], float] = time.monotonic,
        notice_fd: int = 2,
    ) -> None:
        self._stack = stack
        self._same_within = same_within
        self._clock = clock
        self._notice_fd = notice_fd
        self._first_at: float | None = None
        self._previous: dict[int, Any] = {}
        self.received: int | None = None
        self.hurried = False

    def __enter__(self) -> StopSignals:
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self.handle)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def handle(self, signum: int, frame: FrameType | None = None) -> None:
        now = self._clock()
        if self._first_at is None:
            self._first_at = now
            self.received = signum
            self._stack.cancel()
            return
        if now - self._first_at < self._same_within:
            return
        self._stack.hurry()
        if not self.hurried:
            self.hurried = True
            # os.write, not print: the main thread may be inside a print to the same stream.
            name = signal.Signals(signum).name
            self._notice(f"pointsman-stack: {name} again: killing what is still running\n")

    def _notice(self, text: str) -> None:
        with contextlib.suppress(OSError):  # nowhere to say it; the stop goes on
            os.write(self._notice_fd, text.encode())
