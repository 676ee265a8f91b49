"""The real stack, once per session, on free ports: Redis, three simulator pods, collector, picker, Envoy.

Tests talk to Envoy's gateway like a client would, steer what the pods report through the simulator's
``POST /control`` pins, and read what the collector published from its ``GET /v1/pool``.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from integration_kit import TEST_CONFIG, Pool, all_quiet, stack_environ

from pointsman_devstack.stack import SimOptions, Stack, StackOptions, StackPorts
from pointsman_shared.config import load_config


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    config = load_config(TEST_CONFIG, environ={})
    options = StackOptions(
        config_path=TEST_CONFIG,
        run_dir=tmp_path_factory.mktemp("stack"),
        ports=StackPorts.free(len(config.pool.endpoints)),
        # Four slots: every test's adapter fits on any pod, so no test waits for another's to unload.
        sim=SimOptions.for_config(config, max_loras=4),
        environ=stack_environ(),
    )
    with Stack(options) as running:
        yield running


@pytest.fixture(scope="session")
def gateway(stack: Stack) -> Iterator[httpx.Client]:
    """A client of Envoy's listener: every request goes through the picker."""
    with httpx.Client(base_url=stack.gateway_url, timeout=30.0) as client:
        yield client


@pytest.fixture
def pool(stack: Stack) -> Iterator[Pool]:
    """Pins cleared before and after, and the pods back under every threshold before the test runs."""
    with httpx.Client(timeout=5.0) as client:
        pool = Pool(stack, client)
        pool.clear()
        pool.wait_for(all_quiet)
        try:
            yield pool
        finally:
            pool.clear()
