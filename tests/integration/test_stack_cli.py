"""``pointsman-stack`` as `make run` starts it: the banner's curl works, and a signal stops everything."""

from __future__ import annotations

import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml
from integration_kit import TEST_CONFIG, stack_environ

from pointsman_devstack.stack import StackPorts

pytestmark = pytest.mark.integration

BANNER_DONE = "Ctrl-C stops everything."


class _Output:
    """The CLI's stdout, read by a thread so the pipe never fills."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert process.stdout is not None
        self._stream = process.stdout
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._stream:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, process: subprocess.Popen[str], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert process.poll() is None, "pointsman-stack exited:\n" + "\n".join(self.lines)
            assert time.monotonic() < deadline, "no banner:\n" + "\n".join(self.lines)
            time.sleep(0.05)

    def join(self) -> None:
        self._thread.join(timeout=10)


@pytest.fixture
def config_on_free_ports(tmp_path: Path) -> tuple[Path, StackPorts]:
    """The test config with free ports written in, as a user's config would name its ports."""
    doc = yaml.safe_load(TEST_CONFIG.read_text(encoding="utf-8"))
    ports = StackPorts.free(len(doc["pool"]["endpoints"]))
    doc["pool"]["endpoints"] = [f"127.0.0.1:{p}" for p in ports.pods]
    doc["collector"] = {"listen": f"127.0.0.1:{ports.collector}"}
    doc["picker"] = {
        "listen": f"127.0.0.1:{ports.picker}",
        "healthListen": f"127.0.0.1:{ports.picker_health}",
        "metricsListen": f"127.0.0.1:{ports.picker_metrics}",
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path, ports


@pytest.mark.parametrize(
    ("signum", "pickers"), [(signal.SIGINT, 1), (signal.SIGTERM, 2)], ids=["ctrl-c", "sigterm-two-pickers"]
)
def test_the_stack_cli_serves_its_sample_and_stops_on_a_signal(
    config_on_free_ports: tuple[Path, StackPorts], tmp_path: Path, signum: int, pickers: int
) -> None:
    config, ports = config_on_free_ports
    argv = [str(Path(sys.executable).parent / "pointsman-stack"), "--config", str(config), "--quiet"]
    argv += ["--gateway-port", str(ports.gateway), "--admin-port", str(ports.envoy_admin)]
    argv += ["--run-dir", str(tmp_path / "run"), "--pickers", str(pickers)]
    with subprocess.Popen(
        argv, env=stack_environ(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as cli:
        output = _Output(cli)
        try:
            output.wait_for(BANNER_DONE, cli)
            children = psutil.Process(cli.pid).children(recursive=True)
            # sim, collector, the pickers, envoy (+ Redis unless in a container)
            assert len(children) >= 3 + pickers
            _run_the_sample_curl(output.lines)

            cli.send_signal(signum)
            assert cli.wait(timeout=30) == 0, "\n".join(output.lines)
            _, alive = psutil.wait_procs(children, timeout=5)
            assert not alive, f"left running: {alive}"
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.wait()
            output.join()


def _run_the_sample_curl(banner: list[str]) -> None:
    (curl,) = [line.strip() for line in banner if line.strip().startswith("curl ") and " -d " in line]
    if shutil.which("curl") is None:
        return  # the banner was checked to hold the command; nothing here can run it
    answer = subprocess.run(shlex.split(curl), capture_output=True, text=True, timeout=30, check=True)
    assert answer.stdout.startswith("HTTP/1.1 200"), answer.stdout
    assert "x-pointsman-pod: 127.0.0.1:" in answer.stdout
