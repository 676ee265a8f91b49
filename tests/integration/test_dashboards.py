"""Every dashboard panel Pointsman can feed shows data, checked against a real Prometheus.

Debian's Prometheus (``make test-integration`` installs it) scrapes the stack every second with the jobs
of docker-compose's config while every kind of request goes through the gateway: completions, a chat, a
stream with usage, rewritten and sheddable models, a 400, a pod's 404, a 429 shed and a 503 with no
fresh snapshot. Then each query of each panel of our four dashboards (deploy/grafana/dashboards) and of
upstream's (tests/deploy/data/upstream-dashboards, GIE v1.5.0) runs through ``/api/v1/query`` with
Grafana's variables filled in, and must return a number. The panels this stack cannot feed (upstream's
BBR; flow control, off here) are listed in NOT_FED with the reason, and upstream's must stay empty (else
the list is out of date).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from integration_kit import (
    PROMETHEUS_MISSING,
    REPO,
    TEST_CONFIG,
    Pool,
    Prometheus,
    all_quiet,
    completion,
    grafana_expr,
    panel_targets,
    scrape_config,
    shows_data,
)

from pointsman_devstack.stack import Stack
from pointsman_shared.config import load_config

pytestmark = pytest.mark.integration

OURS = sorted((REPO / "deploy/grafana/dashboards").glob("*.json"))
UPSTREAM = REPO / "tests/deploy/data/upstream-dashboards/inference_gateway.json"
BASE = "meta-llama/Llama-3.1-8B-Instruct"

_BBR = (
    "upstream's Body Based Router is a separate ext_proc in front of the picker that copies the body's "
    "model into a header; Pointsman's picker reads the body itself, so no bbr_* series exist"
)
_FLOW_CONTROL = (
    "flow control (the inference_extension_flow_control_* series) is off in this stack, as by default; "
    "tests/deploy/conftest.py checks the names a picker with it on exports"
)
# (dashboard file, panel title): why Pointsman cannot feed it.
NOT_FED = {
    **{
        ("inference_gateway.json", title): _BBR
        for title in (
            "BBR Request Outcomes / s",
            "BBR Plugin Processing Latency",
            "BBR Plugin Processing Latency by Plugin",
        )
    },
    **{
        ("inference_gateway.json", title): _FLOW_CONTROL
        for title in (
            "Pool Saturation",
            "Net Queue Flow",
            "Request Arrival Rate",
            "Queue Depth",
            "Queue Memory Mass",
            "Dispatch Outcomes",
            "Wait Time (P99)",
            "Internal Processing Latency (P99)",
            "Fairness Sharing Rate",
        )
    },
    **{
        ("pointsman-picker.json", title): _FLOW_CONTROL
        for title in (
            "Flow control: queue size by priority and fairness id",
            "Flow control: queue duration (p50, p99) by priority",
            "Flow control: outcomes / s",
            "Flow control: pool saturation",
        )
    },
}

# Grafana's variables: the rate window and the range cover the whole test (Prometheus starts with the
# module), the dashboards' $pool is the test pool. Datasource variables appear only outside queries.
WINDOW = "1m"
VARIABLES = {
    "__rate_interval": WINDOW,
    "__interval": "15s",
    "__range": WINDOW,
    "pool": load_config(TEST_CONFIG, environ={}).pool.name,
}


def test_prometheus_is_installed() -> None:
    # A failure, not a skip: CI's `make test` installs it, so a missing one is a broken setup.
    assert shutil.which("prometheus"), PROMETHEUS_MISSING


@pytest.fixture(scope="module")
def prometheus(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    if shutil.which("prometheus") is None:
        pytest.fail(PROMETHEUS_MISSING)
    server = Prometheus(scrape_config(stack), tmp_path_factory.mktemp("prometheus"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def traffic(stack: Stack, gateway: httpx.Client, prometheus: Prometheus) -> None:
    """Every outcome the dashboards chart, in two rounds a few scrapes apart, so that each series has
    samples before and after an increase (a rate of a series born with its only increase is 0, and a
    quantile of zero rates draws nothing)."""
    with httpx.Client(timeout=5.0) as control:
        pool = Pool(stack, control)
        pool.clear()
        pool.wait_for(all_quiet)
        _wait(lambda: _all_up(prometheus, stack), "every target scraped and up", prometheus)
        _requests(gateway)
        _wait(
            lambda: _has(prometheus, "inference_objective_input_tokens_count"),
            "round one scraped",
            prometheus,
        )
        _shed(gateway, pool)
        _no_snapshot(gateway, stack, pool)
        _requests(gateway)
        # Until every target has been scraped since (the picker counts a response as its stream ends,
        # which can be just after the client has it, and its size and tokens when Envoy's access log
        # flushes, every 0.5 s: a second and a half of margin).
        after = time.time() + 1.5
        _wait(lambda: prometheus.query("min(timestamp(up))")[0] > after, "round two scraped", prometheus)


def _requests(gateway: httpx.Client) -> None:
    ok = [
        gateway.post("/v1/completions", json=completion(BASE)),
        gateway.post("/v1/completions", json=completion("tweet-summary")),  # rewritten to a target
        gateway.post("/v1/completions", json=completion("sql-lora-sheddable")),  # sheddable, served
        gateway.post(
            "/v1/chat/completions", json={"model": BASE, "messages": [{"role": "user", "content": "hi"}]}
        ),
    ]
    stream = completion("sql-lora", max_tokens=6, stream=True, stream_options={"include_usage": True})
    with gateway.stream("POST", "/v1/completions", json=stream) as response:
        ok.append(response)
        assert b"[DONE]" in b"".join(response.iter_bytes())
    assert [r.status_code for r in ok] == [200] * len(ok), [r.text for r in ok if r.status_code != 200]
    bad = gateway.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400  # the picker's BadRequest
    unknown = gateway.post("/v1/completions", json=completion("no-such-model"))
    assert unknown.status_code == 404  # passed through; the pod's 404 is a ModelServerError


def _shed(gateway: httpx.Client, pool: Pool) -> None:
    """A 429: every pod past the sheddable thresholds (queue 5, KV cache 0.8)."""
    for address in pool.addresses:
        pool.pin(address, waiting=10, kvCacheUsage=0.9)
    try:
        pool.wait_for(
            lambda pods: all(p["waiting"] == 10 and p["kvCacheUsage"] >= 0.9 for p in pods.values())
        )
        shed = gateway.post("/v1/completions", json=completion("sql-lora-sheddable"))
        assert shed.status_code == 429, shed.text
    finally:
        pool.clear()
    pool.wait_for(all_quiet)


def _no_snapshot(gateway: httpx.Client, stack: Stack, pool: Pool) -> None:
    """A 503: the collector paused until the picker's snapshot is older than maxStaleness (FailClose)."""
    collector = next(p for p in stack.processes if p.name == "collector")
    os.kill(collector.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 10
        while (status := gateway.post("/v1/completions", json=completion(BASE)).status_code) != 503:
            assert status == 200, status
            assert time.monotonic() < deadline, "no 503 while the collector was paused"
            time.sleep(0.1)
    finally:
        os.kill(collector.pid, signal.SIGCONT)
    pool.wait_for(all_quiet)


def _all_up(prometheus: Prometheus, stack: Stack) -> bool:
    targets = sum(len(job["static_configs"][0]["targets"]) for job in scrape_config(stack)["scrape_configs"])
    return prometheus.query("sum(up)") == [float(targets)]


def _has(prometheus: Prometheus, name: str) -> bool:
    return bool(prometheus.query(name))


def _wait(condition: Callable[[], bool], what: str, prometheus: Prometheus, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s\n{prometheus.log_tail()}"
        time.sleep(0.2)


def _load(path: Path) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return dashboard


@pytest.mark.usefixtures("traffic")
@pytest.mark.parametrize("path", [*OURS, UPSTREAM], ids=lambda p: p.name)
def test_every_panel_pointsman_can_feed_shows_data(path: Path, prometheus: Prometheus) -> None:
    fed = [
        (title, grafana_expr(expr, VARIABLES))
        for title, expr in panel_targets(_load(path))
        if (path.name, title) not in NOT_FED
    ]
    assert fed
    # The last scrapes may still be on their way: the same queries again until each draws or time is up.
    deadline = time.monotonic() + 5
    while empty := [(title, expr) for title, expr in fed if not shows_data(prometheus.query(expr))]:
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not empty, "panels without data:\n" + "\n".join(
        f"  {title!r}: {expr}  (no series: {prometheus.missing_series(expr)})" for title, expr in empty
    )


@pytest.mark.usefixtures("traffic")
@pytest.mark.parametrize("path", OURS, ids=lambda p: p.name)
def test_every_query_variable_offers_the_pool(path: Path, prometheus: Prometheus) -> None:
    for variable in _load(path)["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            metric, label = query.removeprefix("label_values(").removesuffix(")").replace(" ", "").split(",")
            assert VARIABLES["pool"] in prometheus.label_values(label, metric), variable["name"]


@pytest.mark.usefixtures("traffic")
def test_the_upstream_panels_not_fed_are_upstreams_and_draw_nothing(prometheus: Prometheus) -> None:
    targets = list(panel_targets(_load(UPSTREAM)))
    titles = {title for title, _ in targets}
    listed = {title for name, title in NOT_FED if name == UPSTREAM.name}
    assert listed <= titles, f"NOT_FED names panels the dashboard no longer has: {sorted(listed - titles)}"
    drawing = [
        title
        for title, expr in targets
        if title in listed and shows_data(prometheus.query(grafana_expr(expr, VARIABLES)))
    ]
    assert not drawing, f"these panels get data now: take them out of NOT_FED: {drawing}"
