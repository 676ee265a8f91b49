"""What the integration tests share besides fixtures: the pool's pins and views, request builders."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from pointsman_devstack.stack import Stack
from pointsman_shared.config import THRESHOLD_ENV

TEST_CONFIG = Path(__file__).with_name("pointsman-test.yaml")
POD_HEADER = "x-pointsman-pod"

PoolView = dict[str, Any]
PodsByAddress = dict[str, dict[str, Any]]


def stack_environ() -> dict[str, str]:
    """The test process's environment without what would override the test config.

    REDIS_URL goes too: the stack then starts its own Redis (a container when Docker answers, else a
    local binary), which the unit tests' flushes cannot touch.
    """
    dropped = {*THRESHOLD_ENV.values(), "REDIS_URL"}
    return {k: v for k, v in os.environ.items() if k not in dropped}


class Pool:
    """Pins on the simulator pods, and waits until the collector has published what they report."""

    def __init__(self, stack: Stack, client: httpx.Client) -> None:
        self.stack = stack
        self.addresses = stack.pod_addresses
        self._client = client

    def pin(self, address: str, **pins: Any) -> None:
        response = self._client.post(f"http://{address}/control", json={"pin": pins})
        response.raise_for_status()

    def clear(self) -> None:
        for address in self.addresses:
            self._client.post(f"http://{address}/control", json={"pin": None}).raise_for_status()

    def view(self) -> PoolView:
        response = self._client.get(f"{self.stack.collector_url}/v1/pool")
        response.raise_for_status()
        view: PoolView = response.json()
        return view

    def pods(self, view: PoolView | None = None) -> PodsByAddress:
        return {pod["address"]: pod for pod in (view or self.view())["pods"]}

    def picker_version(self) -> int:
        """The version of the snapshot the picker routes with (-1 before its first)."""
        url = f"http://127.0.0.1:{self.stack.ports.picker_metrics}/metrics"
        response = self._client.get(url)
        response.raise_for_status()
        for family in text_string_to_metric_families(response.text):
            if family.name == "pointsman_picker_snapshot_version":
                return int(family.samples[0].value)
        return -1

    def wait_for(self, condition: Callable[[PodsByAddress], bool], timeout: float = 10.0) -> None:
        """Until the collector publishes pods for which ``condition`` holds, and the picker has it."""
        deadline = time.monotonic() + timeout
        view: PoolView = {}
        while time.monotonic() < deadline:
            view = self.view()
            if condition(self.pods(view)) and self.picker_version() >= view["version"]:
                return
            time.sleep(0.02)
        raise AssertionError(f"the collector did not publish the expected state in {timeout}s: {view}")


def all_quiet(pods: PodsByAddress) -> bool:
    return all(p["healthy"] and p["waiting"] == 0 and p["kvCacheUsage"] < 0.5 for p in pods.values())


def completion(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "prompt": "Summarize: the pointsman sets the points.", "max_tokens": 4} | extra
