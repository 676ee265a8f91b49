"""The real local stack, once per session, for the checks that need what the services really do: the
metric names they export (for the dashboards) and their answers to the images' health checks."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from deploy_kit import REPO, make_picker_tls
from prometheus_client import CollectorRegistry, generate_latest

from pointsman_devstack.stack import SimOptions, Stack, StackOptions, StackPorts
from pointsman_picker.context import RequestContext
from pointsman_picker.director import Director
from pointsman_picker.flowcontrol.controller import FlowController, Waiting
from pointsman_picker.flowmetrics import FlowCollector, FlowControlMetrics
from pointsman_picker.interfaces import NoMetrics
from pointsman_picker.snapshots import StaticSnapshotSource
from pointsman_shared.config import THRESHOLD_ENV, load_config, parse_config
from pointsman_testkit import NOW, pod, snapshot

CONFIG = REPO / "config/local.yaml"
# One request per outcome the dashboards chart: routed (critical and sheddable) and a model no config entry
# names (passed through: the pod answers 404).
REQUESTS = ("tweet-summary", "sql-lora-sheddable", "no-such-model")


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    config = load_config(CONFIG, environ={})
    dropped = {*THRESHOLD_ENV.values(), "REDIS_URL"}
    options = StackOptions(
        config_path=CONFIG,
        run_dir=tmp_path_factory.mktemp("stack"),
        ports=StackPorts.free(len(config.pool.endpoints)),
        sim=SimOptions.for_config(config),
        environ={k: v for k, v in os.environ.items() if k not in dropped},
    )
    with Stack(options) as running:
        yield running


@pytest.fixture(scope="session")
def exported_metrics(stack: Stack) -> frozenset[str]:
    """Every series name in the collector's, the picker's, a pod's and Envoy's metrics after some traffic."""
    ports = stack.ports
    pages = [
        f"{stack.collector_url}/metrics",
        f"http://127.0.0.1:{ports.picker_metrics}/metrics",
        f"http://{stack.pod_addresses[0]}/metrics",
        f"{stack.admin_url}/stats/prometheus",
    ]
    with httpx.Client(timeout=30.0) as client:
        for model in REQUESTS:
            body = {"model": model, "prompt": "hello", "max_tokens": 4}
            client.post(f"{stack.gateway_url}/v1/completions", json=body)

        def read() -> frozenset[str]:
            names: set[str] = set()
            for url in pages:
                response = client.get(url)
                response.raise_for_status()
                names.update(exposed_names(response.text))
            return frozenset(names)

        # The picker records a response's metrics as its stream ends, which can be just after the client
        # has the response: read until the names stop changing.
        names, unchanged, deadline = read(), 0, time.monotonic() + 10
        while unchanged < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
            again = read()
            unchanged = unchanged + 1 if again == names else 0
            names = again
    return names | flow_control_names()


def flow_control_names() -> frozenset[str]:
    """The series a picker exports with flow control on (the stack above runs without it): a real
    controller's metrics while one request waits, and after it was dispatched."""
    clock = [NOW]
    config = parse_config({"pool": {"name": "p"}, "flowControl": {"enabled": True}})
    source = StaticSnapshotSource(snapshot(pod(100, updated_at=NOW)))
    director = Director(
        config, source, NoMetrics(), rng=random.Random(0), clock=lambda: clock[0], timer=time.perf_counter
    )
    registry = CollectorRegistry()
    metrics = FlowControlMetrics(registry)
    controller = FlowController(director, config, clock=lambda: clock[0], metrics=metrics)
    registry.register(FlowCollector(controller, metrics.flows, "p"))
    waiting = controller.route(RequestContext("r", b'{"model": "m", "prompt": "hi"}', {}, None))
    assert isinstance(waiting, Waiting)
    waiting.answer = lambda answer: None
    names = exposed_names(generate_latest(registry).decode())  # the queue's gauges
    clock[0] += 0.1
    source.set(snapshot(pod(0, updated_at=clock[0]), version=2))
    assert controller.pump() == 1
    return frozenset(names | exposed_names(generate_latest(registry).decode()))


def exposed_names(page: str) -> set[str]:
    """Series names as a page writes them (prometheus_client's parser would add _total to Envoy's
    counters, which Prometheus does not)."""
    return {
        line.split("{", 1)[0].split(" ", 1)[0]
        for line in page.splitlines()
        if line.strip() and not line.startswith("#")
    }


@pytest.fixture(scope="session")
def picker_tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_picker_tls(tmp_path_factory.mktemp("tls"))
