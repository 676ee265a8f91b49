"""Two picker replicas behind one Envoy, sharing nothing but Redis: kill one under load, and Envoy's
requests keep succeeding (docs/envoy.md, "Active-active pickers", says which settings make it so)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from integration_kit import TEST_CONFIG, completion, stack_environ

from pointsman_devstack.stack import SimOptions, Stack, StackOptions, StackPorts
from pointsman_shared.config import load_config

pytestmark = pytest.mark.integration

CLIENTS = 4
REQUESTS_PER_CLIENT = 60
KILL_AFTER = 60  # completed requests


@pytest.fixture(scope="module")
def two_pickers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    config = load_config(TEST_CONFIG, environ={})
    options = StackOptions(
        config_path=TEST_CONFIG,
        run_dir=Path(tmp_path_factory.mktemp("two-pickers")),
        ports=StackPorts.free(len(config.pool.endpoints), picker_replicas=2),
        sim=SimOptions.for_config(config, max_loras=4, speedup=20.0),
        environ=stack_environ(),
    )
    with Stack(options) as running:
        yield running


def test_killing_one_picker_under_load_keeps_requests_succeeding(two_pickers: Stack) -> None:
    [second] = [p for p in two_pickers.processes if p.name == "picker-2"]
    killed = threading.Event()
    done = threading.Condition()
    completed = 0
    # Per client: the statuses of requests started before the kill, and of those started after it.
    before: list[list[int]] = [[] for _ in range(CLIENTS)]
    after: list[list[int]] = [[] for _ in range(CLIENTS)]

    def client(i: int) -> None:
        nonlocal completed
        with httpx.Client(base_url=two_pickers.gateway_url, timeout=30.0) as http:
            for _ in range(REQUESTS_PER_CLIENT):
                started_after_kill = killed.is_set()
                status = http.post("/v1/completions", json=completion("sql-lora", max_tokens=2)).status_code
                (after if started_after_kill else before)[i].append(status)
                with done:
                    completed += 1
                    done.notify_all()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    with done:
        assert done.wait_for(lambda: completed >= KILL_AFTER, timeout=60)
    second.stop(0)  # SIGKILL: no drain, its open streams break
    killed.set()
    for thread in threads:
        thread.join(timeout=120)
    assert second.returncode is not None
    # Every request started after the kill succeeded: Envoy moved new streams to the live picker.
    assert all(statuses and set(statuses) == {200} for statuses in after), after
    # Before it, only a request whose stream was open on the killed picker, still unanswered, may fail
    # (at most one per client): Envoy answers it 503, as nothing routed it.
    for statuses in before:
        failed = [s for s in statuses if s != 200]
        assert failed in ([], [503]), statuses
