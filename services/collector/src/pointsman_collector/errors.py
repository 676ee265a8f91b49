"""The collector's exceptions. Each carries a short ``reason`` from a fixed set, used as a metric label.

```
CollectorError
├── ScrapeError          one scrape of one pod failed; the pod loop counts it and carries on
│   ├── FetchError       the HTTP exchange failed: timeout, connect, http_status, too_large, protocol
│   └── PageError        the page was fetched but is unusable: content_type, parse, value, no_metrics
├── DiscoveryError       the pod list could not be read: file
└── PublishError         a publish to Redis failed: connection, timeout, server
```
"""

from __future__ import annotations

from pointsman_shared.model_server import MetricsPageError

# Every reason a scrape can fail for, so the error counter can be primed with zeros. ``max_lora`` is a
# partial failure (the LoRA series was unusable, the rest of the page counted); ``internal`` is a bug.
SCRAPE_REASONS = (
    "timeout",
    "connect",
    "http_status",
    "too_large",
    "protocol",
    "content_type",
    "parse",
    "value",
    "no_metrics",
    "max_lora",
    "internal",
)
PUBLISH_REASONS = ("connection", "timeout", "server", "internal")


class CollectorError(Exception):
    """Base of the collector's errors. ``reason`` is bounded; the message carries the detail."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class ScrapeError(CollectorError):
    """One scrape of one pod failed."""


class FetchError(ScrapeError):
    """The HTTP GET of the metrics page failed."""


class ScrapeTimeout(FetchError):
    def __init__(self, detail: str) -> None:
        super().__init__("timeout", detail)


class ConnectError(FetchError):
    """The TCP connection could not be opened."""

    def __init__(self, detail: str) -> None:
        super().__init__("connect", detail)


class HttpStatusError(FetchError):
    def __init__(self, status: int) -> None:
        super().__init__("http_status", f"status {status}")
        self.status = status


class TooLargeError(FetchError):
    def __init__(self, limit: int) -> None:
        super().__init__("too_large", f"body exceeds {limit} bytes")


class HttpProtocolError(FetchError):
    """The server broke HTTP/1.1: a bad status line or framing, or the connection dropped mid-response."""

    def __init__(self, detail: str) -> None:
        super().__init__("protocol", detail)


class PageError(ScrapeError):
    """The page arrived but cannot be used."""

    @classmethod
    def from_metrics_error(cls, exc: MetricsPageError) -> PageError:
        return cls(exc.reason, exc.detail)


class DiscoveryError(CollectorError):
    """The pod list could not be read; the previous list stays in use."""


class PublishError(CollectorError):
    """A publish to Redis failed; the publisher retries on its next round."""
