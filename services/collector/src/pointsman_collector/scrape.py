"""One scrape of one pod: GET its metrics page and read the numbers Pointsman needs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from pointsman_collector.errors import FetchError, PageError
from pointsman_collector.http1 import Response
from pointsman_collector.httpclient import DEFAULT_MAX_BODY, HttpClient
from pointsman_shared.config import split_host_port
from pointsman_shared.model_server import MetricNames, MetricsPageError, PageMetrics, read_page

Outcome = PageMetrics | Exception
Done = Callable[[Outcome], None]


class Scraper(Protocol):
    """Scrapes one pod again and again, one scrape at a time."""

    def start(self, done: Done) -> None:
        """Begin a scrape; ``done`` gets the page's numbers or the failure (a
        :class:`~pointsman_collector.errors.ScrapeError`, or another exception for a bug), once."""
        ...

    async def aclose(self) -> None: ...


class PodScraper:
    def __init__(
        self, address: str, names: MetricNames, *, timeout: float, max_body: int = DEFAULT_MAX_BODY
    ) -> None:
        host, port = split_host_port(address)
        self._client = HttpClient(host, port, timeout=timeout, max_body=max_body)
        self._names = names
        self._done: Done | None = None

    def start(self, done: Done) -> None:
        self._done = done
        self._client.start(self._on_response)

    async def aclose(self) -> None:
        self._done = None
        await self._client.aclose()

    def _on_response(self, response: Response | FetchError) -> None:
        done, self._done = self._done, None
        if done is None:
            return
        outcome: Outcome
        if isinstance(response, Response):
            try:
                check_content_type(response.content_type)
                outcome = parse_page(response.body, self._names)
            except Exception as exc:  # a PageError, or a bug: the caller counts either
                outcome = exc
        else:
            outcome = response
        done(outcome)


# The text exposition format and OpenMetrics; servers that send no type at all are given the benefit.
_PAGE_TYPES = (b"text/plain", b"application/openmetrics-text")


def check_content_type(content_type: bytes | None) -> None:
    """Raise :class:`PageError` when the server says the body is not a metrics page (an HTML error
    page, JSON from the wrong port): numbers found in it would not be the pod's."""
    if content_type is None:
        return
    media_type = content_type.split(b";", 1)[0].strip()
    if media_type not in _PAGE_TYPES:
        raise PageError("content_type", f"Content-Type {content_type[:60].decode('latin-1')!r}")


def parse_page(body: bytes, names: MetricNames) -> PageMetrics:
    """Read a page body; raise :class:`PageError` when it cannot be used."""
    # The page is not checked as a whole: the few lines read from it are (a label set that is not UTF-8
    # or a value that is not a number fails the page), and bytes nobody reads cannot reach the picker.
    try:
        page = read_page(body, names)
    except MetricsPageError as exc:
        raise PageError.from_metrics_error(exc) from None
    if page.waiting is None and page.running is None and page.kv_cache_usage is None and page.lora is None:
        # Likely the wrong port or the wrong modelServer preset: counting this as a good scrape would
        # publish a pod that looks idle.
        raise PageError("no_metrics", f"none of {', '.join(names.families)} on the page")
    return page
