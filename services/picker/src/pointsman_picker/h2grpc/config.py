"""``picker.http2``: what one client connection of the native ext_proc server may do, as the config
file states it. The shared config keeps the section as written (only the picker reads it); the
picker checks it here when it loads the config, with errors naming the path as the shared ones do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, ValidationError

from pointsman_shared.config import ConfigError, ConfigModel, PositiveSeconds, validation_problems

SECTION = "picker.http2"


class Http2Budget(ConfigModel):
    """A token bucket: ``burst`` events at once, refilled at ``perSecond``; past it, GOAWAY
    ENHANCE_YOUR_CALM (nghttp2's rate limiters)."""

    burst: int = Field(ge=1)
    per_second: float = Field(gt=0)


class Http2Config(ConfigModel):
    """Defaults as nghttp2's and gRPC core's (docs/security.md compares them, limit by limit)."""

    # Advertised in SETTINGS; a stream beyond it is refused (REFUSED_STREAM, which Envoy retries).
    max_concurrent_streams: int = Field(default=100, ge=1, le=2**31 - 1)
    # Advertised in SETTINGS and counted while decoding; a request over it: RESOURCE_EXHAUSTED.
    max_header_list_size: int = Field(default=16 * 1024, ge=1024, le=1024 * 1024)
    # Each stream's receive window (returned as its messages are consumed).
    initial_window_size: int = Field(default=1024 * 1024, ge=65_535, le=2**31 - 1)
    # Request bytes held in unfinished messages, per connection (one message always fits).
    max_buffered_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    # Response bytes waiting for a client's flow-control window, per connection.
    max_queued_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    # New streams handled per read before other connections get their turn.
    max_streams_per_read: int = Field(default=32, ge=1)
    # Connections at once; one more is told GOAWAY and closed.
    max_connections: int = Field(default=1024, ge=1)
    # The client's preface and SETTINGS within this.
    handshake_timeout: PositiveSeconds = 10.0
    # GOAWAY a connection with no stream open for this long (null: never).
    idle_timeout: PositiveSeconds | None = 180.0
    # GOAWAY (graceful) at this age, ±10% (null: never); then cancel what is open after the grace
    # (null: let the open calls finish).
    max_connection_age: PositiveSeconds | None = None
    max_connection_age_grace: PositiveSeconds | None = None
    # Streams the client resets while still being worked on, plus the stream errors it causes.
    resets: Http2Budget = Http2Budget(burst=1000, per_second=100)
    pings: Http2Budget = Http2Budget(burst=100, per_second=10)
    # SETTINGS frames (not acknowledgements).
    settings: Http2Budget = Http2Budget(burst=100, per_second=10)
    # DATA with nothing and no END_STREAM, empty header-block fragments, PRIORITY, unknown frames.
    empty_frames: Http2Budget = Http2Budget(burst=1000, per_second=100)

    @classmethod
    def of(cls, section: Mapping[str, Any], source: str = "<config>") -> Http2Config:
        """The section as written under ``picker.http2``; else :class:`ConfigError` naming each bad
        path (``picker.http2.pings.burst``)."""
        try:
            return cls.model_validate(section)
        except ValidationError as exc:
            problems = [
                (f"{SECTION}.{path}" if path else SECTION, message)
                for path, message in validation_problems(exc)
            ]
            raise ConfigError(source, problems) from None
