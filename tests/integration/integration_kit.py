"""What the integration tests share besides fixtures: the pool's pins and views, request builders, a
real Prometheus scraping the stack (with Grafana's variables filled into the dashboards' queries), and
``pointsman-stack`` run as a process (its PIDs, and which of them survive it)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from pointsman_devstack.ports import free_port
from pointsman_devstack.stack import LOOPBACK, Stack, StackPorts
from pointsman_shared.codec import decode_pool
from pointsman_shared.config import THRESHOLD_ENV
from pointsman_shared.keys import RedisKeys
from pointsman_shared.snapshot import PoolSnapshot

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
    # OTEL_* would change what the test config says of tracing.
    return {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("OTEL_")}


class Pool:
    """Pins on the simulator pods, and waits until the collector has published what they report."""

    def __init__(self, stack: Stack, client: httpx.Client) -> None:
        self.stack = stack
        self.addresses = stack.pod_addresses
        self._client = client

    def pin(self, address: str, **pins: Any) -> None:
        response = self._client.post(f"http://{address}/control", json={"pin": pins})
        response.raise_for_status()

    def fault(self, address: str, **faults: Any) -> None:
        """Make ``address`` misbehave (the simulator's ``/control`` faults, e.g. ``metricsStatus=500``)."""
        response = self._client.post(f"http://{address}/control", json={"fault": faults})
        response.raise_for_status()

    def clear(self, *, faults: bool = False) -> None:
        """Clear every pod's pins (and, with ``faults``, its faults)."""
        body: dict[str, None] = {"pin": None, "fault": None} if faults else {"pin": None}
        for address in self.addresses:
            self._client.post(f"http://{address}/control", json=body).raise_for_status()

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


# --- pointsman-stack as a process -----------------------------------------------------------------------

STACK_CLI = Path(sys.executable).parent / "pointsman-stack"
BANNER_DONE = "Ctrl-C stops everything."


def config_on_free_ports(directory: Path, pods: int = 3) -> tuple[Path, StackPorts]:
    """The test config with ``pods`` pods and free ports written in, as a user's config names its ports."""
    doc = yaml.safe_load(TEST_CONFIG.read_text(encoding="utf-8"))
    ports = StackPorts.free(pods)
    doc["pool"]["endpoints"] = [f"{LOOPBACK}:{p}" for p in ports.pods]
    doc["collector"] = {"listen": f"{LOOPBACK}:{ports.collector}"}
    doc["picker"] = {
        "listen": f"{LOOPBACK}:{ports.picker}",
        "healthListen": f"{LOOPBACK}:{ports.picker_health}",
        "metricsListen": f"{LOOPBACK}:{ports.picker_metrics}",
    }
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path, ports


def stack_cli_argv(config: Path, ports: StackPorts, run_dir: Path) -> list[str]:
    """``pointsman-stack`` on ``config``, quiet, Envoy on ``ports``, its files in ``run_dir``."""
    argv = [str(STACK_CLI), "--config", str(config), "--quiet", "--run-dir", str(run_dir)]
    return [*argv, "--gateway-port", str(ports.gateway), "--admin-port", str(ports.envoy_admin)]


class StackRunner:
    """A process running ``pointsman-stack`` (or something that runs it, like make), its output read by
    a thread so the pipe never fills, and the PIDs the stack reports in ``<run dir>/pids.json``."""

    def __init__(self, argv: list[str], run_dir: Path, *, new_session: bool = False) -> None:
        self.run_dir = run_dir
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            argv,
            env=stack_environ(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=new_session,
        )
        assert self.process.stdout is not None
        self._stream = self.process.stdout
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._stream:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, ready: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            assert self.process.poll() is None, f"the runner exited before {what}:\n{self.output}"
            assert time.monotonic() < deadline, f"no {what} in {timeout}s:\n{self.output}"
            time.sleep(0.02)

    def wait_for_banner(self, timeout: float = 60.0) -> None:
        self.wait_for(lambda: any(BANNER_DONE in line for line in self.lines), "banner", timeout)

    def pids(self) -> dict[str, int]:
        """``{"stack": pid, name: pid, ...}`` from pids.json ({} before the stack wrote it)."""
        try:
            report = json.loads((self.run_dir / "pids.json").read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return {"stack": int(report["stack"]), **{k: int(v) for k, v in report["processes"].items()}}

    def close(self) -> None:
        """Kill the runner if it still runs (a failed test), and every process it reported."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for pid in self.pids().values():
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        self._reader.join(timeout=10)
        self._stream.close()


def survivors(pids: Mapping[str, int], timeout: float) -> dict[str, int]:
    """Those of ``pids`` still running after ``timeout`` seconds (a zombie waiting to be reaped is not).

    A PID reused by an unrelated process in the meantime would count as a survivor: the check is
    "nothing with this PID runs", stricter than needed, never looser.
    """
    deadline = time.monotonic() + timeout
    alive = dict(pids)
    while alive:
        alive = {name: pid for name, pid in alive.items() if _running(pid)}
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return alive


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --- faults: traffic through the gateway, each request recorded, and the services' counters -------------


@dataclass(frozen=True)
class Sent:
    """One request sent through the gateway; times on ``time.monotonic()``."""

    started: float
    ended: float
    status: int  # 0: no HTTP answer at all (a transport error)
    pod: str | None  # the pod that answered (its x-pointsman-pod header)


class Traffic:
    """``with Traffic(url, body) as traffic:`` each of ``clients`` threads sends ``body`` to ``url`` one
    request after another (``pause`` seconds apart) until the block ends; every request is recorded."""

    def __init__(
        self,
        url: str,
        body: Mapping[str, Any],
        *,
        clients: int = 1,
        pause: float = 0.0,
        timeout: float = 10.0,
    ) -> None:
        self._url = url
        self._body = dict(body)
        self._pause = pause
        self._timeout = timeout
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sent: list[Sent] = []
        self._threads = [threading.Thread(target=self._send, daemon=True) for _ in range(clients)]

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self._timeout + 5)

    def _send(self) -> None:
        with httpx.Client(timeout=self._timeout) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    response = client.post(self._url, json=self._body)
                    status, pod = response.status_code, response.headers.get(POD_HEADER)
                except httpx.HTTPError:
                    status, pod = 0, None
                with self._lock:
                    self._sent.append(Sent(started, time.monotonic(), status, pod))
                self._stop.wait(self._pause)

    def sent(self, since: float = -math.inf, until: float = math.inf) -> list[Sent]:
        """The requests that started in ``[since, until)``, in the order they started."""
        with self._lock:
            sent = list(self._sent)
        return sorted((s for s in sent if since <= s.started < until), key=lambda s: s.started)

    def wait_for(self, condition: Callable[[list[Sent]], bool], since: float, timeout: float) -> float:
        """Until ``condition`` holds for the requests started since ``since``; returns when it did."""
        deadline = time.monotonic() + timeout
        while not condition(self.sent(since)):
            assert time.monotonic() < deadline, (
                f"traffic never showed it in {timeout}s: {self.sent(since)[-5:]}"
            )
            time.sleep(0.01)
        return time.monotonic()


def failed(sent: list[Sent]) -> list[Sent]:
    return [s for s in sent if s.status != 200]


def metric_sum(client: httpx.Client, url: str, name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` (a counter's ``_total`` included) whose labels include
    ``labels``, from the Prometheus page at ``url``; 0 when there is none."""
    response = client.get(url)
    response.raise_for_status()
    total = 0.0
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name in (name, f"{name}_total") and labels.items() <= sample.labels.items():
                total += sample.value
    return total


@dataclass(frozen=True)
class Published:
    """The pool snapshot in Redis as read at ``seen`` (unix seconds, the collectors' clock)."""

    seen: float
    snapshot: PoolSnapshot


class SnapshotWatch:
    """``with SnapshotWatch(redis_url, pool) as watch:`` a thread reads the snapshot the pickers read
    from Redis every ``every`` seconds and keeps each one it saw (read errors are skipped)."""

    def __init__(self, redis_url: str, pool: str, *, every: float = 0.01) -> None:
        self._client = redis.Redis.from_url(redis_url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self._key = RedisKeys(pool).snapshot
        self._every = every
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._seen: list[Published] = []
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> SnapshotWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._client.close()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                version, data = self._client.hmget(self._key, ["version", "data"])
            except redis.RedisError:
                version = data = None
            if version is not None and data is not None:
                published = Published(time.time(), decode_pool(data, int(version)))
                with self._lock:
                    self._seen.append(published)
            self._stop.wait(self._every)

    def seen(self, since: float = -math.inf) -> list[Published]:
        """The snapshots read at or after ``since`` (unix seconds), oldest first."""
        with self._lock:
            return [p for p in self._seen if p.seen >= since]

    def wait_for(self, condition: Callable[[PoolSnapshot], bool], timeout: float) -> float:
        """Until a snapshot read from now on satisfies ``condition``; returns when it was read."""
        since = time.time()
        deadline = time.monotonic() + timeout
        while True:
            for published in self.seen(since):
                if condition(published.snapshot):
                    return published.seen
            assert time.monotonic() < deadline, f"no such snapshot in {timeout}s: {self.seen(since)[-1:]}"
            time.sleep(self._every)
