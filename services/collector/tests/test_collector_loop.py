"""The collector's loops with fake scrapers and a sink in memory; real HTTP and Redis: test_collector_e2e."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from pointsman_collector.errors import ConnectError, ScrapeTimeout
from pointsman_collector.loop import PUBLISH_SPAN, SCRAPE_SPAN, Collector, SlotClock
from pointsman_collector.normalize import HealthPolicy
from pointsman_collector.scrape import Done
from pointsman_shared.config import TracingConfig
from pointsman_shared.model_server import PageMetrics
from pointsman_shared.snapshot import PodSnapshot, PoolSnapshot
from pointsman_shared.tracing import Tracing

INTERVAL = 0.01


def page(waiting: int = 1, lora_error: str | None = None) -> PageMetrics:
    return PageMetrics(waiting=waiting, running=0, kv_cache_usage=0.1, lora=None, lora_error=lora_error)


class FakeScraper:
    """Answers with ``result`` (a page, or an exception) on the loop's next pass; never while ``hang``
    is set (the answer is kept in ``pending``)."""

    def __init__(self) -> None:
        self.result: PageMetrics | Exception = page()
        self.hang = False
        self.calls = 0
        self.closed = False
        self.pending: Done | None = None

    def start(self, done: Done) -> None:
        self.calls += 1
        if self.hang:
            self.pending = done
            return
        asyncio.get_running_loop().call_soon(done, self.result)

    async def aclose(self) -> None:
        self.closed = True


async def eventually(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(3.0):
        while True:
            if check():
                return
            await asyncio.sleep(0.01)


class Clock:
    def __init__(self) -> None:
        self.now = 1_764_000_000.0

    def __call__(self) -> float:
        return self.now


class Harness:
    def __init__(self, sink, **options: object) -> None:  # type: ignore[no-untyped-def]
        self.sink = sink
        self.scrapers: dict[str, FakeScraper] = {}
        self.kind: type[FakeScraper] = FakeScraper  # what the scraper factory makes
        self.broken: set[str] = set()  # addresses the scraper factory raises for
        self.registry = CollectorRegistry()
        self.clock = Clock()
        settings: dict[str, object] = {
            "interval": INTERVAL,
            "first_round_timeout": 0.5,
            "publish_every": 0.1,
            "policy": HealthPolicy(max_failures=3, staleness=2.0),
            "clock": self.clock,
            "rng": random.Random(1),
            **options,
        }
        self.collector = Collector(
            pool="p", scraper_factory=self.scraper, sink=sink, registry=self.registry, **settings
        )  # type: ignore[arg-type]

    def scraper(self, address: str) -> FakeScraper:
        if address in self.broken:
            raise ValueError(f"no scraper for {address}")
        return self.scrapers.setdefault(address, self.kind())

    def errors(self, reason: str, kind: str = "scrape") -> float:
        value = self.registry.get_sample_value(f"pointsman_collector_{kind}_errors_total", {"reason": reason})
        return value or 0.0

    async def published(self, predicate: Callable[[dict[str, PodSnapshot]], bool]) -> PoolSnapshot:
        return await self.sink.wait_for(lambda pool: predicate({p.address: p for p in pool.pods}))


@pytest.fixture
async def harness(memory_sink) -> AsyncIterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(**options: object) -> Harness:
        made.append(Harness(memory_sink, **options))
        return made[-1]

    yield make
    for h in made:
        await h.collector.stop()


async def test_the_first_publish_waits_for_every_pod(harness) -> None:
    h = harness()
    h.scraper("b").result = ScrapeTimeout("slow")
    h.collector.start(["a", "b"])
    first = await h.published(lambda pods: True)
    pods = {p.address: p for p in first.pods}
    assert (pods["a"].healthy, pods["a"].waiting) == (True, 1)
    assert (pods["b"].healthy, pods["b"].reason) == (False, "timeout")
    assert first.pool == "p"
    assert first.published_at == h.clock.now
    assert h.collector.published is not None
    assert h.collector.published.version == 1
    assert h.collector.readiness() is None


async def test_a_hung_pod_delays_neither_the_others_nor_the_first_publish(harness) -> None:
    h = harness(first_round_timeout=0.1)
    h.scraper("slow").hang = True
    h.collector.start(["slow", "fast"])
    first = await h.published(lambda pods: True)
    assert {p.address: p.reason for p in first.pods} == {"fast": "", "slow": "pending"}
    await asyncio.sleep(0.1)
    assert h.scrapers["slow"].calls == 1
    assert h.scrapers["fast"].calls >= 5


async def test_three_failures_make_a_pod_unhealthy_and_one_good_scrape_heals_it(harness) -> None:
    h = harness()
    h.collector.start(["a"])
    await h.published(lambda pods: pods["a"].healthy)
    h.scrapers["a"].result = ConnectError("refused")
    await h.published(lambda pods: pods["a"].reason == "connect")
    assert h.errors("connect") >= 3
    h.scrapers["a"].result = page(waiting=7)
    healed = await h.published(lambda pods: pods["a"].healthy)
    assert healed.pods[0].waiting == 7


async def test_one_timeout_makes_a_pod_unhealthy(harness) -> None:
    h = harness()
    h.collector.start(["a"])
    await h.published(lambda pods: pods["a"].healthy)
    h.scrapers["a"].result = ScrapeTimeout("slow")
    await h.published(lambda pods: pods["a"].reason == "timeout")
    assert h.errors("timeout") >= 1


async def test_a_pod_with_no_good_scrape_within_the_staleness_window_is_published_stale(harness) -> None:
    h = harness()
    h.collector.start(["a"])
    await h.published(lambda pods: pods["a"].healthy)
    h.scrapers["a"].hang = True
    h.clock.now += 2.5
    await h.published(lambda pods: pods["a"].reason == "stale")


async def test_unexpected_errors_and_lora_errors_are_counted_and_the_loop_goes_on(harness, caplog) -> None:
    h = harness()
    h.scraper("a").result = RuntimeError("bug")
    h.collector.start(["a"])
    await h.published(lambda pods: pods["a"].reason == "internal")
    await eventually(lambda: h.errors("internal") >= 5)
    logged = [r for r in caplog.records if "scrape failed" in r.getMessage()]
    assert len(logged) == 1  # one line (with the traceback) per streak, not one per scrape
    assert logged[0].exc_info is not None
    h.scrapers["a"].result = page(lora_error="max_lora")
    await h.published(lambda pods: pods["a"].healthy)
    assert h.errors("internal") >= 1
    assert h.errors("max_lora") >= 1


async def test_a_scraper_that_raises_instead_of_answering_is_counted_and_tried_again(harness) -> None:
    class Raising(FakeScraper):
        def start(self, done: Done) -> None:
            self.calls += 1
            raise RuntimeError("bug")

    h = harness()
    h.kind = Raising
    h.collector.start(["a", "b"])
    await h.published(lambda pods: pods["a"].reason == "internal")
    await eventually(lambda: h.errors("internal") >= 6 and h.scrapers["a"].calls >= 3)


async def test_publish_failures_are_counted_retried_and_shown_in_readiness(harness, memory_sink) -> None:
    memory_sink.fail = "connection"
    h = harness()
    h.collector.start(["a"])
    await eventually(lambda: h.errors("connection", kind="publish") >= 2)
    assert h.collector.readiness() == "cannot publish to redis (connection)"
    memory_sink.fail = None
    await h.published(lambda pods: True)
    assert h.collector.readiness() is None


async def test_publishes_on_change_at_most_twice_per_interval_and_otherwise_every_heartbeat(harness) -> None:
    h = harness(publish_every=0.1)
    h.collector.start(["a", "b", "c"])
    await h.published(lambda pods: True)
    start = len(h.sink.published)
    await asyncio.sleep(0.5)
    idle = len(h.sink.published) - start
    assert 2 <= idle <= 7  # nothing changes: only the heartbeat

    counter = iter(range(1_000_000))

    class Changing(FakeScraper):
        def start(self, done: Done) -> None:
            self.result = page(waiting=next(counter))
            super().start(done)

    h.collector.set_targets([])
    h.scrapers.clear()
    h.kind = Changing
    h.collector.set_targets(["a", "b", "c"])
    start = len(h.sink.published)
    await asyncio.sleep(0.5)
    busy = len(h.sink.published) - start
    scrapes = sum(s.calls for s in h.scrapers.values())
    assert busy > idle
    assert busy <= 0.5 / (INTERVAL / 2) + 2 < scrapes


async def test_pods_that_leave_are_dropped_and_their_connections_closed(harness) -> None:
    h = harness()
    h.collector.start(["a", "b"])
    await h.published(lambda pods: len(pods) == 2)
    h.collector.set_targets(["b", "c"])
    await h.published(lambda pods: set(pods) == {"b", "c"} and pods["c"].healthy)
    await asyncio.sleep(0)
    assert h.scrapers["a"].closed
    assert not h.scrapers["b"].closed


async def test_a_pod_whose_scraper_cannot_be_made_is_left_out_alone_until_the_targets_change(
    harness, caplog
) -> None:
    h = harness(first_round_timeout=5.0)
    h.broken = {"b"}
    h.collector.start(["a", "b", "c"])
    async with asyncio.timeout(1.0):  # not held up by b: it is not in the pool, so not waited for
        first = await h.published(lambda pods: True)
    assert {p.address: p.healthy for p in first.pods} == {"a": True, "c": True}
    assert h.errors("internal") == 1
    [logged] = [r for r in caplog.records if "cannot make its scraper" in r.getMessage()]
    assert logged.exc_info is not None
    h.broken.clear()
    h.collector.set_targets(["a", "b", "c"])  # the same targets: only b is new
    await h.published(lambda pods: set(pods) == {"a", "b", "c"} and pods["b"].healthy)
    assert h.errors("internal") == 1
    assert all(h.scrapers[a].calls >= 1 for a in "abc")


async def test_stop_closes_every_scraper_and_reports_not_ready(harness) -> None:
    h = harness()
    h.collector.start(["a", "b"])
    await h.published(lambda pods: True)
    h.scrapers["b"].hang = True
    await h.collector.stop()
    assert all(s.closed for s in h.scrapers.values())
    assert h.collector.readiness() == "shutting down"


async def test_an_empty_pool_is_published_at_once(harness) -> None:
    h = harness(first_round_timeout=5.0)
    h.collector.start([])
    first = await h.published(lambda pods: True)
    assert first.pods == ()


async def test_an_answer_that_comes_after_stop_is_ignored(harness) -> None:
    h = harness()
    h.collector.start(["a"])
    await h.published(lambda pods: pods["a"].healthy)
    h.scrapers["a"].hang = True
    await eventually(lambda: h.scrapers["a"].pending is not None)
    published = len(h.sink.published)
    calls = h.scrapers["a"].calls
    await h.collector.stop()
    pending = h.scrapers["a"].pending
    assert pending is not None
    pending(ScrapeTimeout("answered late"))
    await asyncio.sleep(INTERVAL * 3)
    assert h.errors("timeout") == 0
    assert (len(h.sink.published), h.scrapers["a"].calls) == (published, calls)
    assert h.scrapers["a"].closed


async def test_callbacks_of_one_slot_run_together_and_a_past_time_runs_on_the_next_pass() -> None:
    loop = asyncio.get_running_loop()
    clock = SlotClock(0.02)
    slot = (round(loop.time() / 0.02) + 3) * 0.02
    ran: list[str] = []
    finished = loop.create_future()
    # Times within half a slot of one slot share it.
    for name, delta in (("first", 0.004), ("second", -0.004), ("later", 0.04)):
        clock.call_at(loop, slot + delta, lambda name=name: ran.append(name))  # type: ignore[misc]
    clock.call_at(loop, slot + 0.04, lambda: finished.set_result(None))
    await asyncio.sleep(0.02 * 3.6)
    assert ran == ["first", "second"]
    await finished
    assert ran == ["first", "second", "later"]
    clock.call_at(loop, loop.time() - 1.0, lambda: ran.append("past"))
    assert ran[-1] == "later"  # not at once: a pod that never waits must still yield to the loop
    await asyncio.sleep(0)
    assert ran[-1] == "past"
    clock.close()


def traced(**options: object) -> tuple[Tracing, InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    config = TracingConfig(enabled=True, sampler="always_on", **options)  # type: ignore[arg-type]
    return Tracing(config, "pointsman-collector", span_exporter=spans), spans


async def test_a_traced_collector_records_its_publish_rounds(harness) -> None:
    tracing, spans = traced()
    h = harness(tracer=tracing.tracer("test"))
    h.scraper("b").result = ScrapeTimeout("slow")
    h.collector.start(["a", "b"])
    await h.published(lambda pods: True)
    tracing.flush()
    publish = [s for s in spans.get_finished_spans() if s.name == PUBLISH_SPAN]
    assert publish
    attributes = dict(publish[0].attributes or {})
    assert attributes["pointsman.pool"] == "p"
    assert (attributes["pointsman.pods"], attributes["pointsman.healthy_pods"]) == (2, 1)
    assert attributes["pointsman.result"] == "published"
    assert attributes["pointsman.snapshot_version"] == 1
    assert "pointsman.oldest_reading_age_s" in attributes
    tracing.shutdown()


async def test_a_scrape_longer_than_the_interval_is_a_span_and_a_quick_one_is_not(harness) -> None:
    tracing, spans = traced()
    h = harness(tracer=tracing.tracer("test"))
    h.scraper("slow").hang = True
    h.collector.start(["slow", "fast"])
    await eventually(lambda: h.scrapers["slow"].pending is not None)
    await asyncio.sleep(INTERVAL * 3)
    pending = h.scrapers["slow"].pending
    assert pending is not None
    pending(page())
    tracing.flush()
    scrapes = [s for s in spans.get_finished_spans() if s.name == SCRAPE_SPAN]
    assert [dict(s.attributes or {})["pointsman.pod"] for s in scrapes] == ["slow"]
    attributes = dict(scrapes[0].attributes or {})
    assert attributes["pointsman.result"] == "ok"
    assert float(attributes["pointsman.duration_s"]) >= INTERVAL * 3
    tracing.shutdown()
