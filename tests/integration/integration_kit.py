"""What the integration tests share besides fixtures: the pool's pins and views, request builders, and a
real Prometheus scraping the stack (with Grafana's variables filled into the dashboards' queries)."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from pointsman_devstack.ports import free_port
from pointsman_devstack.stack import LOOPBACK, Stack
from pointsman_shared.config import THRESHOLD_ENV

REPO = Path(__file__).resolve().parents[2]
# The dashboards' PromQL helpers live with their static checks (tests/deploy/deploy_kit.py).
sys.path.append(str(REPO / "tests/deploy"))
from deploy_kit import dashboard_panels, promql_metric_names  # noqa: E402

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


# --- a real Prometheus --------------------------------------------------------------------------------

PROMETHEUS_CONFIG = REPO / "deploy/prometheus/prometheus.yaml"
PROMETHEUS_MISSING = (
    "prometheus is not installed: `make test` (or `make test-integration`) installs Debian's package "
    "as root with apt-get (the Makefile's `prometheus` step); elsewhere put a prometheus 2.x on PATH"
)


def scrape_config(stack: Stack, interval: str = "1s") -> dict[str, Any]:
    """docker-compose's Prometheus config (deploy/prometheus/prometheus.yaml: its job names are what the
    dashboards select on) with each job's targets this stack's, scraped every ``interval``."""
    config: dict[str, Any] = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    ports = stack.ports
    targets = {
        "collector": [f"{LOOPBACK}:{ports.collector}"],
        "picker": [f"{LOOPBACK}:{metrics}" for _, _, metrics in ports.pickers],
        "pods": list(stack.pod_addresses),
        "envoy": [f"{LOOPBACK}:{ports.envoy_admin}"],
    }
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert jobs == set(targets), f"{PROMETHEUS_CONFIG} has jobs {sorted(jobs)}, the stack {sorted(targets)}"
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": targets[job["job_name"]]}]
    config["global"] = {
        "scrape_interval": interval,
        "scrape_timeout": interval,
        "evaluation_interval": interval,
    }
    return config


class Prometheus:
    """A Prometheus server on a free loopback port, its data and log in ``directory``; stop() ends it."""

    def __init__(self, config: Mapping[str, Any], directory: Path, *, timeout: float = 20.0) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise FileNotFoundError(PROMETHEUS_MISSING)
        config_file = directory / "prometheus.yaml"
        config_file.write_text(yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")
        self.url = f"http://{LOOPBACK}:{free_port()}"
        self.log_path = directory / "prometheus.log"
        with self.log_path.open("w", encoding="utf-8") as log:
            self._process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config_file}",
                    f"--storage.tsdb.path={directory / 'data'}",
                    f"--web.listen-address={self.url.removeprefix('http://')}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._client = httpx.Client(base_url=self.url, timeout=10.0)
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise AssertionError(f"prometheus exited with {self._process.returncode}: {self.log_tail()}")
            try:
                if self._client.get("/-/ready").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"prometheus not ready in {timeout}s: {self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(encoding="utf-8").splitlines()[-lines:])

    def query(self, expr: str) -> list[float]:
        """The values an instant query returns now (one per series; a scalar is one value)."""
        response = self._client.get("/api/v1/query", params={"query": expr})
        body = response.json()
        if response.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"prometheus refused {expr!r}: {body.get('error', response.text)}")
        data = body["data"]
        if data["resultType"] == "scalar":
            return [float(data["result"][1])]
        return [float(series["value"][1]) for series in data["result"]]

    def missing_series(self, expr: str) -> list[str]:
        """The metric names ``expr`` selects of which Prometheus holds no current series."""
        return [
            name for name in sorted(promql_metric_names(expr)) if not self.query(f'{{__name__="{name}"}}')
        ]

    def label_values(self, label: str, match: str) -> list[str]:
        response = self._client.get(f"/api/v1/label/{label}/values", params={"match[]": match})
        response.raise_for_status()
        values: list[str] = response.json()["data"]
        return values

    def stop(self) -> None:
        self._client.close()
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


def shows_data(values: list[float]) -> bool:
    """What a Grafana panel draws: some series with a number (NaN draws nothing)."""
    return any(not math.isnan(value) for value in values)


# --- Grafana's variables --------------------------------------------------------------------------------

_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")


def grafana_expr(expr: str, variables: Mapping[str, str]) -> str:
    """``expr`` with Grafana's variables (``$x``, ``${x}``, ``${x:fmt}``) replaced from ``variables``;
    an unknown variable fails the test rather than reaching Prometheus."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in variables:
            raise AssertionError(f"no value for the Grafana variable ${name} in {expr!r}")
        return variables[name]

    return _VARIABLE.sub(value, expr)


def panel_targets(dashboard: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, expr) for each query of each panel, those inside rows included."""
    for panel in dashboard_panels(dict(dashboard)):
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield str(panel.get("title")), str(target["expr"])
