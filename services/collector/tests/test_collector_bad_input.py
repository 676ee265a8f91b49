"""Bad answers from one pod, over real HTTP: each is counted with its reason on that pod alone, the pod
keeps the numbers last read from it, and the other pods carry on."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import CollectorRegistry

from pointsman_collector.loop import Collector
from pointsman_collector.normalize import HealthPolicy
from pointsman_collector.scrape import PodScraper
from pointsman_shared.model_server import PRESETS

MAX_BODY = 64 * 1024
GOOD = "vllm:num_requests_waiting 7\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.25\n"


@pytest.fixture
async def collector(memory_sink) -> AsyncIterator[Callable[[CollectorRegistry], Collector]]:  # type: ignore[no-untyped-def]
    made: list[Collector] = []

    def make(registry: CollectorRegistry) -> Collector:
        names = PRESETS["vllm"]
        made.append(
            Collector(
                pool="p",
                scraper_factory=lambda a: PodScraper(a, names, timeout=0.2, max_body=MAX_BODY),
                sink=memory_sink,
                registry=registry,
                interval=0.01,
                first_round_timeout=1.0,
                publish_every=0.05,
                policy=HealthPolicy(max_failures=2, staleness=30.0),
                rng=random.Random(1),
            )
        )
        return made[-1]

    yield make
    for c in made:
        await c.stop()


@pytest.mark.parametrize(
    ("page", "reply", "reason"),
    [
        (GOOD, {"status": 500}, "http_status"),
        (GOOD, {"content_type": "text/html"}, "content_type"),
        ("vllm:num_requests_waiting{a=} 99\n", {}, "parse"),
        ("vllm:num_requests_waiting ninety\n", {}, "parse"),
        ("vllm:num_requests_waiting NaN\nvllm:num_requests_running 99\n", {}, "value"),
        ("vllm:num_requests_waiting 99\n" * 5000, {}, "too_large"),
        (GOOD, {"delay": 0.5}, "timeout"),
        (GOOD, {"reset": True}, "protocol"),
        ("", {"raw": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"}, "protocol"),
        (
            "",
            {"raw": b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\nvllm:num_requests_waiting 99\n"},
            "protocol",
        ),
        ("process_cpu_seconds_total 99\n", {}, "no_metrics"),
        ("vllm:num_requests_waiting 1\n\xff", {}, "parse"),
    ],
    ids=[
        "500",
        "wrong content type",
        "malformed line",
        "non-numeric value",
        "nan",
        "huge page",
        "timeout",
        "connection reset",
        "not http",
        "body cut short",
        "no wanted metric",
        "not utf-8",
    ],
)
async def test_one_bad_pod_is_counted_and_keeps_its_last_numbers(
    collector, memory_sink, pod_server, page: str, reply: dict[str, object], reason: str
) -> None:  # type: ignore[no-untyped-def]
    good = await pod_server(GOOD)
    bad = await pod_server(GOOD)
    registry = CollectorRegistry()
    c = collector(registry)
    c.start([good.address, bad.address])
    await memory_sink.wait_for(lambda pool: all(p.healthy for p in pool.pods))

    bad.serve(page.encode("latin-1"), **reply)
    pool = await memory_sink.wait_for(lambda pool: any(not p.healthy for p in pool.pods))
    pods = {p.address: p for p in pool.pods}
    assert pods[good.address].healthy
    assert (pods[bad.address].healthy, pods[bad.address].reason) == (False, reason)
    # Never a number it did not read: the bad pod shows what its last good page said.
    assert (pods[bad.address].waiting, pods[bad.address].running) == (7, 2)
    errors = registry.get_sample_value("pointsman_collector_scrape_errors_total", {"reason": reason})
    assert (errors or 0) >= 2

    bad.serve(GOOD)
    await memory_sink.wait_for(lambda pool: all(p.healthy for p in pool.pods))
