"""Bad answers from one pod, over real HTTP: each is counted with its reason on that pod alone, the pod
keeps the numbers last read from it, and the other pods carry on."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import CollectorRegistry

from pointsman_collector.loop import Collector
from pointsman_collector.normalize import HealthPolicy
from pointsman_collector.scrape import PodScraper
from pointsman_shared.config import parse_config
from pointsman_shared.model_server import PRESETS
from pointsman_shared.snapshot import PoolSnapshot

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
        (
            "vllm:num_requests_waiting 99\n"
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="caf\xe9"} 1\n',
            {},
            "parse",
        ),
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
        "adapter name not utf-8",
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
    assert (errors or 0) >= (1 if reason == "timeout" else 2)  # a timeout is unhealthy at once

    bad.serve(GOOD)
    await memory_sink.wait_for(lambda pool: all(p.healthy for p in pool.pods))


class CountingSink:
    """Records, at each publish, the pod's health and how many failing replies its server had sent."""

    def __init__(self, requests: Callable[[], int]) -> None:
        self.requests = requests
        self.base = 0  # the server's request count when it began failing
        self.seen: list[tuple[bool, int]] = []
        self.changed = asyncio.Event()

    async def publish(self, pool: PoolSnapshot) -> int:
        self.seen.append((pool.pods[0].healthy, self.requests() - self.base))
        self.changed.set()
        return len(self.seen)


@pytest.mark.parametrize("max_failures", [1, 5])
async def test_max_failures_from_the_config_decides_when_a_pod_turns_unhealthy(
    pod_server, max_failures: int
) -> None:  # type: ignore[no-untyped-def]
    server = await pod_server(GOOD)
    config = parse_config(
        {
            "pool": {"name": "p", "endpoints": [server.address]},
            "redis": {"url": "redis://127.0.0.1:1"},
            "collector": {
                "interval": "10ms",
                "timeout": "1s",
                "maxFailures": max_failures,
                "staleness": "1h",
            },
        }
    )
    sink = CountingSink(lambda: server.requests)
    collector = Collector.from_config(config, sink=sink, registry=CollectorRegistry())
    collector.start(config.pool.endpoints)
    try:
        async with asyncio.timeout(3.0):
            while not (sink.seen and sink.seen[-1][0]):
                sink.changed.clear()
                await sink.changed.wait()
            # A request is counted and answered in one step of the server: every request counted from
            # here on fails, and no earlier one does.
            sink.base = server.requests
            start = len(sink.seen)
            server.serve(GOOD, status=500)
            while sink.seen[-1][0]:
                sink.changed.clear()
                await sink.changed.wait()
    finally:
        await collector.stop()
    healthy = [sent for ok, sent in sink.seen[start:] if ok]
    unhealthy = [sent for ok, sent in sink.seen[start:] if not ok]
    # Unhealthy only once max_failures replies failed; healthy until then (one more may be in flight).
    assert min(unhealthy) >= max_failures
    assert all(sent <= max_failures for sent in healthy)
