"""A picker replica SIGKILLed under load (~50 req/s of streamed completions), in each body mode: what the
clients lose. docs/reliability.md, "Picker killed under load", has the figures and docs/envoy.md, "Body
modes", why they differ.

Each case starts a picker of its own beside the stack's (the survivor) and an Envoy in front of both,
then kills its picker while requests run through both. Lost: anything but a 200 with the whole stream.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from integration_kit import completion, stack_environ

from pointsman_devstack import envoy
from pointsman_devstack.ports import free_port
from pointsman_devstack.process import ManagedProcess
from pointsman_devstack.readiness import grpc_serving, http_ok, wait_ready
from pointsman_devstack.stack import LOOPBACK, Stack
from pointsman_shared.config import join_host_port, load_config

pytestmark = pytest.mark.integration

RATE = 50.0  # requests started per second, whatever the answers do (open loop)
BEFORE_KILL = 0.4  # seconds of load before the kill, at least (20 requests started, most still open)
AFTER_KILL = 3.0  # and after it: past the 2.8 s after which failures were once seen
MAX_TOKENS = 60  # a streamed answer of ~0.5 s: many requests are in their response phase at the kill


@dataclass
class Outcome:
    started: float
    ended: float
    ok: bool
    what: str  # the status, or why the request failed


@dataclass
class Run:
    outcomes: list[Outcome] = field(default_factory=list)
    kill: float = 0.0  # when the picker was killed, on the outcomes' clock
    age: float = 0.0  # how long the picker had run then

    @property
    def lost(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    @property
    def in_flight(self) -> int:
        """Requests open when the picker died (on either picker: the clients cannot tell)."""
        return sum(1 for o in self.outcomes if o.started <= self.kill <= o.ended)

    def figures(self, label: str, retried: int) -> str:
        late = [o for o in self.lost if o.started > self.kill]
        return (
            f"{label}: {len(self.outcomes)} requests at {RATE:g}/s, picker killed {self.age:.1f} s after its "
            f"start, {self.in_flight} in flight then, "
            f"{len(self.lost)} lost ({len(late)} started after it), {retried} picker streams retried; "
            f"lost: {sorted({o.what for o in self.lost})}"
        )


class Picker:
    """One more picker replica: the stack's config with ports of its own."""

    def __init__(self, stack: Stack, run_dir: Path, name: str) -> None:
        doc = yaml.safe_load(stack.config_file.read_text(encoding="utf-8"))
        self.port, health, metrics = free_port(), free_port(), free_port()
        doc["picker"]["listen"] = join_host_port(LOOPBACK, self.port)
        doc["picker"]["healthListen"] = join_host_port(LOOPBACK, health)
        doc["picker"]["metricsListen"] = join_host_port(LOOPBACK, metrics)
        config = run_dir / f"{name}.yaml"
        config.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        self.started = time.monotonic()
        argv = [str(Path(sys.executable).with_name("pointsman-picker")), "--config", str(config)]
        env = stack_environ() | {"REDIS_URL": stack.redis_url, "PYTHONUNBUFFERED": "1"}
        self.process = ManagedProcess(name, argv, env=env, log_path=run_dir / f"{name}.log")
        wait_ready(self.process, grpc_serving(join_host_port(LOOPBACK, health)), timeout=30, what="SERVING")


class Gateway:
    """An Envoy in front of ``pickers`` (the stack's bootstrap with ``overrides``)."""

    def __init__(self, stack: Stack, run_dir: Path, name: str, pickers: tuple[int, ...], **overrides: Any):
        listen, admin = join_host_port(LOOPBACK, free_port()), join_host_port(LOOPBACK, free_port())
        options = envoy.EnvoyOptions.from_config(
            load_config(stack.config_file, environ={}), gateway_listen=listen, admin_listen=admin
        )
        options = replace(options, pickers=tuple(join_host_port(LOOPBACK, p) for p in pickers), **overrides)
        self.options = options
        path = envoy.write_bootstrap(options, run_dir / f"{name}.yaml")
        argv = [envoy.find_envoy(), "-c", str(path), "--disable-hot-restart", "--concurrency", "2"]
        self.process = ManagedProcess(name, argv, env=stack_environ(), log_path=run_dir / f"{name}.log")
        self.url, self.admin = f"http://{listen}", f"http://{admin}"
        with httpx.Client(timeout=1.0) as probe:
            wait_ready(self.process, http_ok(probe, f"{self.admin}/ready"), timeout=30, what="admin /ready")

    def retried(self) -> int:
        stat = f"cluster.{envoy.PICKER_CLUSTER}.upstream_rq_retry_success"
        text = httpx.get(f"{self.admin}/stats", params={"filter": stat}, timeout=5).text
        return sum(int(line.rsplit(":", 1)[1]) for line in text.splitlines() if line.startswith(stat))


async def _load(url: str, run: Run, stop: threading.Event, t0: float, slow_uploads: bool) -> None:
    """Start RATE requests a second until ``stop``; every second one uploads its body in three parts,
    0.1 s apart, when ``slow_uploads`` (a stream open, unanswered, on the picker meanwhile)."""
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=url, timeout=30.0, limits=limits) as http:

        async def one(i: int) -> None:
            started = time.monotonic() - t0
            body = json.dumps(completion("sql-lora", max_tokens=MAX_TOKENS, stream=True)).encode()
            content: bytes | AsyncIterator[bytes] = body
            if slow_uploads and i % 2:
                content = _in_parts(body)
            headers = {"content-type": "application/json"}
            try:
                async with http.stream("POST", "/v1/completions", content=content, headers=headers) as r:
                    data = await r.aread()
                ok = r.status_code == 200 and data.rstrip().endswith(b"data: [DONE]")
                what = f"{r.status_code} {data[:120]!r}" if not ok else "200"
            except httpx.HTTPError as exc:
                ok, what = False, type(exc).__name__
            run.outcomes.append(Outcome(started, time.monotonic() - t0, ok, what))

        tasks = []
        i = 0
        while not stop.is_set():
            tasks.append(asyncio.create_task(one(i)))
            i += 1
            await asyncio.sleep(max(0.0, t0 + i / RATE - time.monotonic()))
        await asyncio.gather(*tasks)


async def _in_parts(body: bytes) -> AsyncIterator[bytes]:
    third = len(body) // 3
    for part in (body[:third], body[third : 2 * third], body[2 * third :]):
        yield part
        await asyncio.sleep(0.1)


def kill_under_load(gateway: Gateway, victim: Picker, *, kill_after_start: float, slow_uploads: bool) -> Run:
    """Load through ``gateway`` (in a thread: processes start and stop from the main one); SIGKILL
    ``victim`` once it has run ``kill_after_start`` seconds and the load BEFORE_KILL; AFTER_KILL more."""
    run, stop = Run(), threading.Event()
    t0 = time.monotonic()
    thread = threading.Thread(target=lambda: asyncio.run(_load(gateway.url, run, stop, t0, slow_uploads)))
    thread.start()
    try:
        time.sleep(max(BEFORE_KILL, victim.started + kill_after_start - t0))
        # Read the clock first: a request may fail before stop() has reaped the picker.
        run.kill, run.age = time.monotonic() - t0, time.monotonic() - victim.started
        victim.process.stop(0)  # SIGKILL at once: no drain, its connections break
        time.sleep(AFTER_KILL)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive()
    return run


@pytest.fixture
def run_dir(stack: Stack, request: pytest.FixtureRequest) -> Path:
    path = stack.run_dir / "picker-killed" / request.node.name.replace("[", "-").rstrip("]")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def started() -> Iterator[list[ManagedProcess]]:
    processes: list[ManagedProcess] = []
    yield processes
    for process in reversed(processes):
        process.stop(2.0)


# BUFFERED: the picker answers the headers at once and the body a moment later; a request in between
# when its picker dies cannot be replayed (its stream was answered) and goes unrouted (503 `no healthy
# upstream`). That window is well under a millisecond a request, so at 50 req/s most runs lose none;
# one in six lost one (docs/reliability.md). The bound: that few, all open at the kill, none after it.
BUFFERED_WINDOW_LOSSES = 2

CASES = {
    # The default with responses shown to the picker. Killed 1.5 s after it started, as in the report
    # of failures 2.8 s later (they were FULL_DUPLEX_STREAMED's, below).
    "buffered": ({}, {"kill_after_start": 1.5, "slow_uploads": False}),
    # STREAMED, the body sent without waiting for the header answer: Envoy holds every chunk until
    # the picker answers it, so it can go on without one that died.
    "early-body": (
        {"request_body_mode": envoy.STREAMED, "body_without_waiting": True},
        {"kill_after_start": 1.5, "slow_uploads": True},
    ),
    # Requests only: Envoy closes the stream once routed. Slow uploads leave streams open, unanswered,
    # on the dying picker: Envoy replays them to the other one.
    "full-duplex-requests-only": (
        {"response_processing": False},
        {"kill_after_start": 0.0, "slow_uploads": True},
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_no_request_is_lost_when_a_picker_dies(
    case: str, stack: Stack, run_dir: Path, started: list[ManagedProcess], capsys: pytest.CaptureFixture[str]
) -> None:
    overrides, load = CASES[case]
    victim = Picker(stack, run_dir, "picker-victim")
    started.append(victim.process)
    gateway = Gateway(stack, run_dir, "envoy", (stack.ports.picker, victim.port), **overrides)
    started.append(gateway.process)
    run = kill_under_load(gateway, victim, **load)
    with capsys.disabled():
        print(f"\n{run.figures(f'{case} ({gateway.options.body_mode})', gateway.retried())}")
    assert run.in_flight >= 5, "too few requests in flight at the kill to show anything"
    if case != "buffered":
        assert run.lost == []  # every stream open on the dead picker was unanswered: replayed
        return
    assert len(run.lost) <= BUFFERED_WINDOW_LOSSES, run.lost
    for lost in run.lost:
        assert lost.started <= run.kill <= lost.ended, lost
        assert "no_healthy_upstream" in lost.what, lost


def test_full_duplex_with_responses_loses_only_what_its_picker_had_routed(
    stack: Stack, run_dir: Path, started: list[ManagedProcess], capsys: pytest.CaptureFixture[str]
) -> None:
    # Envoy 1.40 ignores failure_mode_allow once a FULL_DUPLEX_STREAMED body has gone to the picker, so
    # the requests the dead picker had routed fail (cut mid-stream, or 503 before their response). The
    # bound: no more than were in flight, and none started after the kill.
    victim = Picker(stack, run_dir, "picker-victim")
    started.append(victim.process)
    gateway = Gateway(
        stack, run_dir, "envoy", (stack.ports.picker, victim.port), request_body_mode=envoy.FULL_DUPLEX
    )
    started.append(gateway.process)
    run = kill_under_load(gateway, victim, kill_after_start=0.0, slow_uploads=False)
    with capsys.disabled():
        print(f"\n{run.figures('full-duplex with responses', gateway.retried())}")
    assert len(run.lost) <= run.in_flight
    assert all(o.started <= run.kill for o in run.lost), run.lost
