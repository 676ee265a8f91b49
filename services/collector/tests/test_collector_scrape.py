from __future__ import annotations

import asyncio

import pytest

from pointsman_collector.errors import PageError, ScrapeError
from pointsman_collector.scrape import PodScraper, check_content_type, parse_page
from pointsman_shared.model_server import PRESETS, PageMetrics

VLLM = PRESETS["vllm"]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"vllm:num_requests_waiting{a=} 1\n", "parse"),
        (b'vllm:num_requests_waiting 1\nvllm:lora_requests_info{running_lora_adapters="\xff"} 1\n', "parse"),
        (b'vllm:num_requests_waiting{engine="\xe9"} 1\n', "parse"),
        (b"vllm:num_requests_waiting 1\xff\n", "parse"),
        (b"vllm:num_requests_waiting -1\n", "value"),
        (b"", "no_metrics"),
        (b"sglang:num_queue_reqs 3\n", "no_metrics"),
        (b"# HELP vllm:num_requests_waiting x\nprocess_cpu_seconds_total 1\n", "no_metrics"),
        (b"vllm:num_requests_waiting three\n", "parse"),
        (b"vllm:num_requests_waiting NaN\n", "value"),
        (b"vllm:num_requests_running +Inf\n", "value"),
        (b"vllm:kv_cache_usage_perc NaN\n", "value"),
        (b'vllm:num_requests_waiting 1\nvllm:num_requests_waiting{engine="1"} x\n', "parse"),
        (b"<html><body>vllm:num_requests_waiting 1</body></html>", "no_metrics"),
    ],
    ids=[
        "bad labels",
        "adapter name not utf-8",
        "label not utf-8",
        "value not utf-8",
        "negative",
        "empty",
        "other server's names",
        "help text only",
        "word for a value",
        "nan queue",
        "infinite queue",
        "nan kv",
        "one bad engine spoils the page",
        "html",
    ],
)
def test_unusable_pages(body: bytes, reason: str) -> None:
    with pytest.raises(PageError) as excinfo:
        parse_page(body, VLLM)
    assert excinfo.value.reason == reason


@pytest.mark.parametrize(
    "body",
    [
        b"vllm:num_requests_running 2\n",
        b'vllm:lora_requests_info{max_lora="1",running_lora_adapters="a",waiting_lora_adapters=""} 1\n',
    ],
    ids=["one family", "lora only"],
)
def test_a_page_with_any_family_counts(body: bytes) -> None:
    parse_page(body, VLLM)


def test_bytes_that_are_not_utf8_count_only_where_read() -> None:
    body = b'# HELP x caf\xe9\nvllm:num_requests_waiting 3\nother{a="\xff"} 1\n\xfe\xff\n'
    assert parse_page(body, VLLM).waiting == 3


async def scrape(scraper: PodScraper) -> PageMetrics:
    """One scrape, awaited; raises what it fails with."""
    future: asyncio.Future[PageMetrics | Exception] = asyncio.get_running_loop().create_future()
    scraper.start(future.set_result)
    outcome = await future
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


async def test_scrapes_a_fixture_page_over_http(pod_server, fixture_page) -> None:
    server = await pod_server(fixture_page("vllm-v0-lora"), chunk_size=4096)
    scraper = PodScraper(server.address, VLLM, timeout=1.0)
    try:
        page = await scrape(scraper)
        assert (page.waiting, page.running, page.kv_cache_usage) == (3, 10, pytest.approx(0.42))
        assert page.lora is not None
        assert page.lora.running == {"tweet-summary-1", "sql-lora"}
        server.serve("", status=503)
        with pytest.raises(ScrapeError) as excinfo:
            await scrape(scraper)
        assert excinfo.value.reason == "http_status"
    finally:
        await scraper.aclose()


@pytest.mark.parametrize(
    ("content_type", "ok"),
    [
        (None, True),
        (b"text/plain; version=0.0.4; charset=utf-8", True),
        (b"text/plain", True),
        (b"application/openmetrics-text; version=1.0.0", True),
        (b"text/html; charset=utf-8", False),
        (b"application/json", False),
    ],
)
def test_content_types(content_type: bytes | None, ok: bool) -> None:
    if ok:
        check_content_type(content_type)
        return
    with pytest.raises(PageError) as excinfo:
        check_content_type(content_type)
    assert excinfo.value.reason == "content_type"


async def test_a_page_of_the_wrong_type_is_refused_over_http(pod_server, fixture_page) -> None:
    # A proxy's HTML error page may quote metric lines; none of its numbers may count.
    server = await pod_server(fixture_page("vllm-v0-lora"), content_type="text/html")
    scraper = PodScraper(server.address, VLLM, timeout=1.0)
    try:
        with pytest.raises(ScrapeError) as excinfo:
            await scrape(scraper)
        assert excinfo.value.reason == "content_type"
    finally:
        await scraper.aclose()
