"""The collector against hostile pods, over real sockets: the whole collector (``create_collector``, its
default limits) scrapes one well-behaved pod and pods that redirect, send an endless head or body, send
slowly (slowloris), or announce a huge body. Each hostile pod is published unhealthy with its reason
within the scrape timeout or the size caps, what it manages to send stays bounded, the collector never
follows it anywhere else, and the good pod is scraped throughout."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from pointsman_collector.assembly import bind_listener, create_collector
from pointsman_collector.http1 import Limits
from pointsman_shared.config import parse_config
from pointsman_shared.snapshot import PoolSnapshot
from pointsman_testkit import eventually

PAGE = b"vllm:num_requests_waiting 7\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.25\n"
TIMEOUT = 0.3  # collector.timeout here: the deadline for connect and the whole response
# What a hostile pod can push on one connection before the collector drops it: the caps (a head, a chunked
# body's bytes with their framing) and what the kernel's socket buffers on both ends hold, generously
# (loopback buffers grow to a few MB).
SENT_BOUND = Limits().max_head + 2 * Limits().max_body + 16 * 1024 * 1024
Behaviour = Callable[["HostilePod", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class HostilePod:
    """A pod answering every request as ``behaviour`` says; it records what it heard and sent."""

    behaviour: Behaviour
    address: str = ""
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    most_sent: int = 0  # the most bytes written on one connection
    _sent: dict[asyncio.StreamWriter, int] = field(default_factory=dict)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        # Cancelled too (the test's loop ending): a test server has nothing to clean up but its socket.
        quiet = (
            ConnectionError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            asyncio.CancelledError,
        )
        with contextlib.suppress(*quiet):
            while True:
                self.requests.append(await reader.readuntil(b"\r\n\r\n"))
                await self.behaviour(self, reader, writer)
        writer.close()

    async def write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await writer.drain()
        self._sent[writer] = sent = self._sent.get(writer, 0) + len(data)
        self.most_sent = max(self.most_sent, sent)


async def good(pod: HostilePod, _: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    head = f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(PAGE)}\r\n\r\n"
    await pod.write(writer, head.encode() + PAGE)


def redirect(to: str) -> Behaviour:
    async def behave(pod: HostilePod, _: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = f"HTTP/1.1 302 Found\r\nLocation: http://{to}/steal\r\nContent-Length: 0\r\n\r\n"
        await pod.write(writer, head.encode())

    return behave


async def endless_head(pod: HostilePod, _: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await pod.write(writer, b"HTTP/1.1 200 OK\r\n")
    while True:
        await pod.write(writer, b"X-Padding: " + b"a" * 4000 + b"\r\n")


async def endless_body(pod: HostilePod, _: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await pod.write(writer, b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")  # read until close
    while True:
        await pod.write(writer, b"vllm:num_requests_waiting 1\n" * 2000)


async def endless_chunks(pod: HostilePod, _: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await pod.write(writer, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"vllm:num_requests_waiting 1\n" * 2000
    while True:
        await pod.write(writer, b"%x\r\n%s\r\n" % (len(chunk), chunk))


def slowloris(head: bytes) -> Behaviour:
    """``head``, then a byte every 20 ms of what should follow (the rest of the head or a body)."""

    async def behave(pod: HostilePod, _: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await pod.write(writer, head)
        while True:
            await pod.write(writer, b"v")
            await asyncio.sleep(0.02)

    return behave


def raw(data: bytes) -> Behaviour:
    async def behave(pod: HostilePod, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await pod.write(writer, data)
        await reader.read()  # and say nothing more, until the collector hangs up

    return behave


class Sink:
    """The snapshots the collector publishes, in memory."""

    def __init__(self) -> None:
        self.last: PoolSnapshot | None = None
        self.count = 0

    async def publish(self, pool: PoolSnapshot) -> int:
        self.count += 1
        self.last = pool
        return self.count


@contextlib.asynccontextmanager
async def listening(pod: HostilePod) -> AsyncIterator[HostilePod]:
    server = await asyncio.start_server(pod.serve, "127.0.0.1", 0)
    pod.address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield pod
    finally:
        server.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2):
                await server.wait_closed()


# What each hostile pod does, the reason it is published with, and whether it is found out before the
# scrape deadline (a size cap or a bad answer) rather than by it.
CASES: dict[str, tuple[Behaviour | None, str, bool]] = {
    "redirect": (None, "http_status", True),  # to the bait: set in the test
    "endless head": (endless_head, "protocol", True),
    "endless body": (endless_body, "too_large", True),
    "endless chunks": (endless_chunks, "too_large", True),
    "slowloris head": (slowloris(b"HTTP/1.1 200 OK\r\nX-Slow: "), "timeout", False),
    "slowloris body": (
        slowloris(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n"),
        "timeout",
        False,
    ),
    "huge content-length": (
        raw(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 99999999999999\r\n\r\n"),
        "too_large",
        True,
    ),
    "huge chunk": (
        raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffff\r\n"),
        "too_large",
        True,
    ),
    "silent": (raw(b""), "timeout", False),
}


async def test_hostile_pods_are_cut_off_within_the_caps_and_the_good_pod_goes_on() -> None:
    bait = HostilePod(good)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(listening(bait))
        well = await stack.enter_async_context(listening(HostilePod(good)))
        hostile: dict[str, HostilePod] = {}
        for name, (behaviour, _, _) in CASES.items():
            pod = HostilePod(behaviour or redirect(bait.address))
            hostile[name] = await stack.enter_async_context(listening(pod))
        addresses = [well.address, *(p.address for p in hostile.values())]
        config = parse_config(
            {
                "pool": {"name": "hostile", "endpoints": addresses},
                "redis": {"url": "redis://127.0.0.1:1/0"},  # unused: the sink is in memory
                "collector": {"interval": "50ms", "timeout": f"{TIMEOUT}s", "maxFailures": 1},
            }
        )
        sink = Sink()
        service = create_collector(
            config, registry=CollectorRegistry(), sink=sink, listen=bind_listener("127.0.0.1", 0)
        )
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with service:

            def reasons() -> dict[str, str]:
                pods = {p.address: p for p in (sink.last.pods if sink.last else ())}
                return {
                    name: pods[pod.address].reason for name, pod in hostile.items() if pod.address in pods
                }

            def all_found_out() -> bool:
                return all(r not in ("", "pending") for r in reasons().values()) and len(reasons()) == len(
                    CASES
                )

            await eventually(all_found_out, within=10.0, interval=0.01)
            found_in = loop.time() - started
            assert sink.last is not None
            first = {p.address: p for p in sink.last.pods}[well.address]
            await asyncio.sleep(4 * TIMEOUT)  # the hostile pods go on being scraped, and cut off
            assert sink.last is not None
            pods = {p.address: p for p in sink.last.pods}
            assert {name: pods[pod.address].reason for name, pod in hostile.items()} == {
                name: reason for name, (_, reason, _) in CASES.items()
            }
            assert not any(pods[pod.address].healthy for pod in hostile.values())
            # The good pod, meanwhile: healthy and read again and again.
            assert pods[well.address].healthy
            assert pods[well.address].waiting == 7
            assert pods[well.address].updated_at > first.updated_at
    # Everyone was found out about when the first scrape's deadline passed (with room for a loaded
    # machine): no hostile pod holds its scrape open for long.
    assert found_in < TIMEOUT + 4.0
    for name, pod in hostile.items():
        assert pod.most_sent < SENT_BOUND, name
        assert pod.connections >= 2, name  # cut off and scraped again, on a fresh connection
        # Only ever the configured request: GET /metrics, Host the pod's own address.
        expected = b"GET /metrics HTTP/1.1\r\nHost: " + pod.address.encode() + b"\r\n"
        assert all(r.startswith(expected) for r in pod.requests), name
    # Redirects are answers, not directions: nothing ever asked the bait for anything.
    assert bait.connections == 0


@pytest.mark.parametrize("name", ["endless body", "endless chunks", "endless head"])
async def test_an_endless_answer_is_dropped_at_the_cap_not_at_the_deadline(name: str) -> None:
    # Found out by size: long before a generous deadline, having sent no more than the caps allow.
    behaviour, reason, _ = CASES[name]
    assert behaviour is not None
    async with listening(HostilePod(behaviour)) as pod:
        config = parse_config(
            {
                "pool": {"name": "hostile", "endpoints": [pod.address]},
                "redis": {"url": "redis://127.0.0.1:1/0"},
                "collector": {"interval": "1s", "timeout": "30s", "maxFailures": 1},
            }
        )
        sink = Sink()
        service = create_collector(
            config, registry=CollectorRegistry(), sink=sink, listen=bind_listener("127.0.0.1", 0)
        )
        async with service:

            def found_out() -> bool:
                return sink.last is not None and sink.last.pods[0].reason == reason

            await eventually(found_out, within=5.0, interval=0.01)
    assert pod.most_sent < SENT_BOUND
