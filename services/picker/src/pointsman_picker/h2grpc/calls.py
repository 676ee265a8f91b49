"""What a gRPC method sees of a call on this server: the contract between the HTTP/2 side and the
methods (the ext_proc and health services), apart from both."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Protocol


class Status(enum.IntEnum):
    """The gRPC status codes this server answers with."""

    OK = 0
    CANCELLED = 1
    INVALID_ARGUMENT = 3
    NOT_FOUND = 5
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14


class Call(Protocol):
    """What a method does with one call, told as its request side unfolds."""

    def message(self, payload: bytes) -> None: ...

    def half_closed(self) -> None:
        """The client sent its last message."""

    def cancelled(self) -> None:
        """The call ended before it finished (reset, connection lost or shutdown)."""


class ServerStream(Protocol):
    """The call's response side; what it is given goes out in order, then the status. ``metadata`` is
    the request's header fields as decoded (pseudo-headers too), for what a method reads of the call's
    metadata (the W3C trace context)."""

    metadata: Sequence[tuple[bytes, bytes]]

    def send(self, payload: bytes) -> None: ...

    def finish(self, status: Status = Status.OK, message: str = "") -> None: ...


Method = Callable[[ServerStream], Call]
"""Starts a call: given the response side, returns what hears the request side."""
