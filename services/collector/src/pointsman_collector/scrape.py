"""One scrape of one pod: GET its metrics page and read the numbers Pointsman needs."""

from __future__ import annotations

from typing import Protocol

from pointsman_collector.errors import PageError
from pointsman_collector.httpclient import DEFAULT_MAX_BODY, HttpClient
from pointsman_shared.config import split_host_port
from pointsman_shared.model_server import MetricNames, MetricsPageError, PageMetrics, read_page


class Scraper(Protocol):
    """Scrapes one pod again and again. ``scrape`` raises :class:`~pointsman_collector.errors.ScrapeError`."""

    async def scrape(self) -> PageMetrics: ...

    async def aclose(self) -> None: ...


class PodScraper:
    def __init__(
        self, address: str, names: MetricNames, *, timeout: float, max_body: int = DEFAULT_MAX_BODY
    ) -> None:
        host, port = split_host_port(address)
        self._client = HttpClient(host, port, timeout=timeout, max_body=max_body)
        self._names = names

    async def scrape(self) -> PageMetrics:
        return parse_page(await self._client.get(), self._names)

    async def aclose(self) -> None:
        await self._client.aclose()


def parse_page(body: bytes, names: MetricNames) -> PageMetrics:
    """Read a page body; raise :class:`PageError` when it cannot be used."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise PageError("parse", "page is not UTF-8") from None
    try:
        page = read_page(text, names)
    except MetricsPageError as exc:
        raise PageError.from_metrics_error(exc) from None
    if page.waiting is None and page.running is None and page.kv_cache_usage is None and page.lora is None:
        # Likely the wrong port or the wrong modelServer preset: counting this as a good scrape would
        # publish a pod that looks idle.
        raise PageError("no_metrics", f"none of {', '.join(names.families)} on the page")
    return page
