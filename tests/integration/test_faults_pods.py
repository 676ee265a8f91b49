"""A pod that dies or whose ``/metrics`` goes slow, garbled or 500 leaves routing, with its reason
counted, while the other pods serve on (docs/reliability.md, "Faults and figures").

Each test steers every request to one pod (the others pinned at 3 waiting requests), sends requests
one after another through Envoy, breaks that pod, and measures how long the picker kept routing to it:
from the fault to the start of the last request it got. Each prints a ``measured:`` line (pytest -s).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from integration_kit import (
    TEST_CONFIG,
    PodsByAddress,
    Pool,
    Sent,
    Traffic,
    all_quiet,
    completion,
    failed,
    metric_sum,
    stack_environ,
)

from pointsman_devstack.stack import SimOptions, Stack, StackOptions, StackPorts
from pointsman_shared.config import load_config

pytestmark = pytest.mark.integration

CONFIG = load_config(TEST_CONFIG, environ={})
INTERVAL = CONFIG.collector.interval
SCRAPE_TIMEOUT = CONFIG.collector.timeout
# The bound: out of routing within two scrape intervals plus the scrape timeout (1.1 s).
EXPECTED = 2 * INTERVAL + SCRAPE_TIMEOUT
# This 2-core machine is shared with other test runs: a bound is asserted with this much slack.
SLACK = 1.0
TARGET = 1  # the pod each test breaks
BASE_MODEL = CONFIG.models[0].model_name


@pytest.fixture(scope="module")
def pod_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The test config's stack with one simulator process per pod, so that one pod can die alone."""
    options = StackOptions(
        config_path=TEST_CONFIG,
        run_dir=Path(tmp_path_factory.mktemp("pod-faults")),
        ports=StackPorts.free(len(CONFIG.pool.endpoints)),
        sim=SimOptions.for_config(CONFIG, max_loras=4, speedup=20.0, process_per_pod=True),
        environ=stack_environ(),
    )
    with Stack(options) as running:
        yield running


@pytest.fixture
def pool(pod_stack: Stack) -> Iterator[Pool]:
    """Every pod up, without pins or faults, before and after."""
    with httpx.Client(timeout=5.0) as client:
        pool = Pool(pod_stack, client)
        pool.clear(faults=True)
        pool.wait_for(all_quiet)
        try:
            yield pool
        finally:
            if pod_stack.process(f"sim-{TARGET}").returncode is not None:
                pod_stack.restart(f"sim-{TARGET}")
            pool.clear(faults=True)
            pool.wait_for(lambda pods: all(p["healthy"] for p in pods.values()))


@dataclass(frozen=True)
class Outcome:
    out_after: float  # seconds from the fault to the last request routed to the pod
    sent: list[Sent]  # every request started after the fault
    reason: str  # the reason the collector published for the pod
    counted: float  # scrape errors counted with the expected reason since the fault


def _break_one_pod(
    pool: Pool, stack: Stack, fault: Callable[[], None], *, reasons: set[str], bound: float
) -> Outcome:
    target = pool.addresses[TARGET]
    others = [a for a in pool.addresses if a != target]
    for address in others:
        pool.pin(address, waiting=3)
    pool.pin(target, waiting=0)
    pool.wait_for(lambda pods: all(pods[a]["waiting"] == 3 for a in others))
    metrics_url = f"{stack.collector_url}/metrics"
    with httpx.Client(timeout=5.0) as client:
        before = {
            r: metric_sum(client, metrics_url, "pointsman_collector_scrape_errors", reason=r) for r in reasons
        }
        body = completion(BASE_MODEL, max_tokens=2)
        # One client, 20 ms between requests: about 40 requests a second.
        with Traffic(f"{stack.gateway_url}/v1/completions", body, pause=0.02) as traffic:
            steady = time.monotonic()
            traffic.wait_for(lambda sent: [s.pod for s in sent[-5:]] == [target] * 5, steady, timeout=10)
            broke = time.monotonic()
            fault()
            # Done once no request has gone to the pod for a second (and some went elsewhere meanwhile).
            traffic.wait_for(lambda sent: _left_for(sent, target, 1.0), broke, timeout=bound + SLACK + 2)
            sent = traffic.sent(broke)
        view = pool.pods()
        counted = sum(
            metric_sum(client, metrics_url, "pointsman_collector_scrape_errors", reason=r) - before[r]
            for r in reasons
        )
    routed = [s for s in sent if _to(s, target)]
    out_after = routed[-1].started - broke if routed else 0.0
    _others_unaffected(view, others, [s for s in sent if not _to(s, target)])
    return Outcome(out_after, sent, view[target]["reason"], counted)


def _to(sent: Sent, target: str) -> bool:
    """Whether the request went to ``target``: answered by it, or not answered at all (only the broken
    pod fails a request here; a killed pod cannot say it was the one)."""
    return sent.pod == target or sent.status != 200


def _left_for(sent: list[Sent], target: str, quiet: float) -> bool:
    if not sent:
        return False
    recent = [s for s in sent if s.started >= sent[-1].started - quiet]
    return (
        sent[-1].started - sent[0].started >= quiet
        and len(recent) >= 5
        and not any(_to(s, target) for s in recent)
    )


def _others_unaffected(view: PodsByAddress, others: list[str], their_requests: list[Sent]) -> None:
    for address in others:
        assert view[address]["healthy"], view[address]
    assert their_requests, "no request went to the other pods"
    assert not failed(their_requests), failed(their_requests)


def _report(fault: str, outcome: Outcome, bound: float) -> None:
    lost = len(failed(outcome.sent))
    span = outcome.sent[-1].ended - outcome.sent[0].started
    print(
        f"measured: {fault}: out of routing after {outcome.out_after:.2f} s (bound {bound:.2f} s), "
        f"reason {outcome.reason}, {outcome.counted:.0f} scrape errors counted, "
        f"{lost} of {len(outcome.sent)} requests failed ({len(outcome.sent) / span:.0f}/s)"
    )


@pytest.mark.parametrize(
    ("fault", "faults", "reason"),
    [
        pytest.param("HTTP 500", {"metricsStatus": 500}, "http_status", id="http-500"),
        pytest.param("garbage", {"metricsMalformed": True}, "parse", id="garbage"),
    ],
)
def test_a_pod_whose_metrics_fail_leaves_routing(
    pool: Pool, pod_stack: Stack, fault: str, faults: dict[str, object], reason: str
) -> None:
    target = pool.addresses[TARGET]
    outcome = _break_one_pod(
        pool, pod_stack, lambda: pool.fault(target, **faults), reasons={reason}, bound=EXPECTED
    )
    _report(f"/metrics {fault}", outcome, EXPECTED)
    assert outcome.out_after <= EXPECTED + SLACK
    assert outcome.reason == reason
    assert outcome.counted >= CONFIG.collector.max_failures
    assert not failed(outcome.sent)  # the pod still serves; it only stopped telling its load


def test_a_pod_with_slow_metrics_leaves_routing(pool: Pool, pod_stack: Stack) -> None:
    target = pool.addresses[TARGET]
    delay_ms = round(SCRAPE_TIMEOUT * 5 * 1000)
    outcome = _break_one_pod(
        pool,
        pod_stack,
        lambda: pool.fault(target, metricsDelayMs=delay_ms),
        reasons={"timeout"},
        bound=EXPECTED,
    )
    _report(f"/metrics {delay_ms} ms late", outcome, EXPECTED)
    # A scrape that times out makes the pod unhealthy at once (docs/collector.md, "Bad answers").
    assert outcome.out_after <= EXPECTED + SLACK
    assert outcome.reason == "timeout"
    assert outcome.counted >= 1
    assert not failed(outcome.sent)


def test_a_killed_pod_leaves_routing(pool: Pool, pod_stack: Stack) -> None:
    name = f"sim-{TARGET}"
    outcome = _break_one_pod(
        pool, pod_stack, lambda: pod_stack.kill(name), reasons={"connect", "protocol"}, bound=EXPECTED
    )
    _report("pod SIGKILLed", outcome, EXPECTED)
    assert outcome.out_after <= EXPECTED + SLACK
    assert outcome.reason in ("connect", "protocol")
    assert outcome.counted >= CONFIG.collector.max_failures
