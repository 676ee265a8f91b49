"""One connection's flood budgets: what a client may make this side do for nothing before it is told
GOAWAY ENHANCE_YOUR_CALM (or COMPRESSION_ERROR, for a header block too big to decode).

Token buckets count stream resets (rapid reset, CVE-2023-44487, and the stream errors a client
causes), PINGs, SETTINGS and frames that carry nothing this server uses (empty DATA, empty header-block
fragments as in CVE-2024-27316, PRIORITY, unknown types, unasked-for acknowledgements). A header block
is capped in bytes and in CONTINUATION frames; a SETTINGS frame in entries. nghttp2 keeps the same
budgets on its session; here they are an object of their own that the protocol asks before acting.

Each check raises :class:`~pointsman_picker.h2grpc.wire.H2ConnectionError` when the budget is spent:
the protocol turns that into GOAWAY. The clock is the caller's, read only when a budgeted frame arrives.
"""

from __future__ import annotations

from collections.abc import Callable

from pointsman_picker.h2grpc.limits import Limits, Rate
from pointsman_picker.h2grpc.wire import ErrorCode, H2ConnectionError

MAX_SETTINGS = 32  # entries in one SETTINGS frame (nghttp2's NGHTTP2_DEFAULT_MAX_SETTINGS)


class TokenBucket:
    """Counts one kind of event against a :class:`Rate`; the clock is the caller's."""

    __slots__ = ("_at", "_burst", "_per_second", "_tokens")

    def __init__(self, rate: Rate, now: float) -> None:
        self._burst = float(rate.burst)
        self._per_second = rate.per_second
        self._tokens = float(rate.burst)
        self._at = now

    def take(self, now: float) -> bool:
        """Spend one token; False when the bucket is empty (the event is over budget)."""
        tokens = min(self._burst, self._tokens + max(now - self._at, 0.0) * self._per_second)
        self._at = now
        if tokens < 1.0:
            self._tokens = tokens
            return False
        self._tokens = tokens - 1.0
        return True


class FloodBudgets:
    """The budgets of one connection, from its :class:`Limits`."""

    __slots__ = (
        "_acks_due",
        "_clock",
        "_continuations",
        "_empty",
        "_limits",
        "_pings",
        "_resets",
        "_settings",
        "max_block",
        "max_continuations",
    )

    def __init__(self, limits: Limits, clock: Callable[[], float]) -> None:
        self._limits = limits
        self._clock = clock
        now = clock()
        self._resets = TokenBucket(limits.resets, now)
        self._pings = TokenBucket(limits.pings, now)
        self._settings = TokenBucket(limits.settings, now)
        self._empty = TokenBucket(limits.empty_frames, now)
        self._acks_due = 1  # SETTINGS acknowledgements the peer owes this side (for its preface)
        self.max_block = limits.max_header_block  # read on every HEADERS frame: a plain attribute
        self.max_continuations = limits.max_continuations
        self._continuations = 0  # CONTINUATION frames of the header block being gathered

    def reset(self) -> None:
        """A stream reset by the client while this side still worked on it, or a stream error."""
        self._spend(self._resets, self._limits.resets, "stream resets")

    def ping(self) -> None:
        self._spend(self._pings, self._limits.pings, "PINGs")

    def settings(self, payload_bytes: int) -> None:
        """A SETTINGS frame (not an acknowledgement) of ``payload_bytes``."""
        self._spend(self._settings, self._limits.settings, "SETTINGS frames")
        if payload_bytes > 6 * MAX_SETTINGS:
            raise H2ConnectionError(
                f"more than {MAX_SETTINGS} settings in one frame", ErrorCode.ENHANCE_YOUR_CALM
            )

    def settings_ack(self) -> None:
        """A SETTINGS acknowledgement: one this side asked for is free; any other is an empty frame."""
        if self._acks_due:
            self._acks_due -= 1
        else:
            self.empty()

    def empty(self) -> None:
        """A frame that carries nothing this server uses."""
        self._spend(self._empty, self._limits.empty_frames, "empty frames")

    def header_block(self, size: int) -> None:
        """A header block of ``size`` bytes so far (HEADERS, then each CONTINUATION)."""
        if size > self.max_block:
            raise self.block_too_large(size)

    def block_started(self) -> None:
        """A HEADERS frame without END_HEADERS: its CONTINUATIONs are counted from here."""
        self._continuations = 0

    def continuation(self) -> None:
        self._continuations += 1
        if self._continuations > self.max_continuations:
            raise H2ConnectionError(
                f"more than {self.max_continuations} CONTINUATION frames in one header block",
                ErrorCode.ENHANCE_YOUR_CALM,
            )

    def block_too_large(self, size: int) -> H2ConnectionError:
        # Not decoded, the block leaves this side's HPACK table behind the peer's: the connection
        # cannot go on (RFC 9113 §4.3).
        return H2ConnectionError(
            f"a header block of {size}+ bytes, past {self._limits.max_header_block}",
            ErrorCode.COMPRESSION_ERROR,
        )

    def _spend(self, bucket: TokenBucket, rate: Rate, what: str) -> None:
        if not bucket.take(self._clock()):
            raise H2ConnectionError(
                f"more {what} than {rate.burst} at once or {rate.per_second:g} a second",
                ErrorCode.ENHANCE_YOUR_CALM,
            )
