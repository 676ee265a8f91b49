"""What one connection of the HTTP/2 server allows a client (the budgets that count floods are in
``budgets.py``).

Pure data: the sans-IO protocol makes every decision from these and a clock it is
given; the timers (handshake, idle, age) are the asyncio side's (``connection.py``, ``server.py``).
The defaults follow nghttp2's and gRPC core's; ``docs/security.md`` compares them per limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Rate:
    """A token bucket: ``burst`` events at once, refilled at ``per_second`` (nghttp2's rate limiters)."""

    burst: int
    per_second: float


@dataclass(frozen=True, slots=True)
class Limits:
    """One connection's limits; a client past a budget gets GOAWAY ENHANCE_YOUR_CALM."""

    # Advertised in SETTINGS; a stream beyond it is refused (RST_STREAM REFUSED_STREAM). nghttpx and
    # python-hyper/h2: 100; nghttp2 the library and gRPC core: unlimited unless set.
    max_concurrent_streams: int = 100
    # Advertised in SETTINGS; counted while decoding (name + value + 32 a field). A request over it is
    # answered RESOURCE_EXHAUSTED; a header block too big to decode at all ends the connection. gRPC
    # core: 16 KiB hard (8 KiB soft); h2 and nghttpx: 64 KiB.
    max_header_list_size: int = 16 * 1024
    # Each stream's receive window, advertised in SETTINGS and returned as messages are consumed (opened
    # further only for a message already announced, within ``max_buffered_bytes``).
    initial_window_size: int = 1024 * 1024
    # Request bytes this connection holds in unfinished messages, over all its streams; the stream that
    # would pass it is answered RESOURCE_EXHAUSTED (one message alone always fits, up to the message cap).
    max_buffered_bytes: int = 16 * 1024 * 1024
    # Response bytes waiting for a client's flow-control window; past it the client is not reading and
    # the connection ends (ENHANCE_YOUR_CALM), as nghttp2 ends a session whose outbound queue floods.
    max_queued_bytes: int = 16 * 1024 * 1024
    # New streams handled per read before the other connections get their turn (gRPC core's
    # grpc.http2.max_requests_per_read, 32).
    max_streams_per_read: int = 32
    # Streams the client resets while this side still works on them, plus the stream errors its frames
    # cause (rapid reset, CVE-2023-44487, and its "made you reset" variant). nghttp2: 1000 burst, 33/s,
    # counting every RST_STREAM (Envoy's reset after each answered ext_proc stream is not counted here).
    resets: Rate = field(default_factory=lambda: Rate(1000, 100.0))
    # PING frames. gRPC core: 2 strikes of pings closer than 5 minutes without data.
    pings: Rate = field(default_factory=lambda: Rate(100, 10.0))
    # SETTINGS frames (not their acknowledgements).
    settings: Rate = field(default_factory=lambda: Rate(100, 10.0))
    # Frames that carry nothing this server uses: DATA with no payload and no END_STREAM, header-block
    # fragments with nothing in them (zero-length CONTINUATION, CVE-2024-27316), PRIORITY, unknown types,
    # unasked-for acknowledgements. nghttp2's "glitch" limiter: 10000 burst, 330/s.
    empty_frames: Rate = field(default_factory=lambda: Rate(1000, 100.0))

    @property
    def max_header_block(self) -> int:
        """The most header-block bytes gathered (HEADERS + CONTINUATION) before decoding: a bigger block
        cannot be decoded within the list limit by any sane encoder, and ends the connection."""
        return max(2 * self.max_header_list_size, 16 * 1024)

    @property
    def max_continuations(self) -> int:
        """CONTINUATION frames allowed after one HEADERS: what the block limit needs in the smallest
        frames a peer may use, four times over (nghttp2: 8; hyper derives it the same way)."""
        return max(8, 4 * -(-self.max_header_block // 16_384))


@dataclass(frozen=True, slots=True)
class Timeouts:
    """A connection's timers, in seconds (None: none)."""

    # The client's preface and first SETTINGS arrive within this, or GOAWAY and close (gRPC core's
    # server handshake timeout: 120 s; nghttpx waits 10 s for a SETTINGS acknowledgement).
    handshake: float | None = 10.0
    # GOAWAY once no stream has been open this long (gRPC core's max_connection_idle: off; nghttpx: 3 min).
    idle: float | None = 180.0
    # GOAWAY (graceful) at this age, ±10%; then cancel what is still open after ``age_grace`` (gRPC
    # core's max_connection_age and its grace: both off by default).
    max_age: float | None = None
    age_grace: float | None = None


NO_TIMERS = Timeouts(handshake=None, idle=None)
