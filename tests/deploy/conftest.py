"""The real local stack, once per session, for the checks that need what the services really do: the
metric names they export (for the dashboards) and their answers to the images' health checks."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from deploy_kit import REPO, make_picker_tls
from prometheus_client.parser import text_string_to_metric_families

from pointsman_devstack.stack import SimOptions, Stack, StackOptions, StackPorts
from pointsman_shared.config import THRESHOLD_ENV, load_config

CONFIG = REPO / "config/local.yaml"
# One request per outcome the dashboards chart: routed (critical and sheddable) and unknown model.
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
    """Every series name in the collector's, the picker's and a pod's /metrics after some traffic."""
    ports = stack.ports
    pages = [
        f"{stack.collector_url}/metrics",
        f"http://127.0.0.1:{ports.picker_metrics}/metrics",
        f"http://{stack.pod_addresses[0]}/metrics",
    ]
    names: set[str] = set()
    with httpx.Client(timeout=30.0) as client:
        for model in REQUESTS:
            body = {"model": model, "prompt": "hello", "max_tokens": 4}
            client.post(f"{stack.gateway_url}/v1/completions", json=body)
        for url in pages:
            response = client.get(url)
            response.raise_for_status()
            for family in text_string_to_metric_families(response.text):
                names.update(sample.name for sample in family.samples)
    return frozenset(names)


@pytest.fixture(scope="session")
def picker_tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_picker_tls(tmp_path_factory.mktemp("tls"))
