"""A stack that cannot start says which process failed and why, and leaves nothing running; a runner
that is killed or signalled twice leaves nothing running either (docs/reliability.md)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from integration_kit import (
    BANNER_DONE,
    TEST_CONFIG,
    StackRunner,
    config_on_free_ports,
    stack_cli_argv,
    stack_environ,
    survivors,
)

from pointsman_devstack.errors import StackError
from pointsman_devstack.stack import Stack, StackOptions, StackPorts

pytestmark = pytest.mark.integration


def test_a_taken_pod_port_fails_the_start_naming_the_simulator(tmp_path: Path) -> None:
    ports = StackPorts.free(3)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", ports.pods[1]))
        squatter.listen()
        stack = Stack(
            StackOptions(
                config_path=TEST_CONFIG,
                run_dir=tmp_path,
                ports=ports,
                environ=stack_environ(),
                startup_timeout=20,
            )
        )
        before = set(psutil.Process().children(recursive=True))
        with pytest.raises(StackError, match=r"^sim ") as caught:
            stack.start()
    assert caught.value.log_path == str(tmp_path / "sim.log")
    assert stack.redis is None
    assert not stack.processes
    left = set(psutil.Process().children(recursive=True)) - before
    assert not left, f"left running: {left}"


# --- the runner dies or is signalled: nothing of the stack survives it ---------------------------------
# The figures in docs/reliability.md come from the `measured` lines these tests print (pytest -s).

SURVIVAL_BOUND = 5.0  # seconds: every child gone this long after the runner died (measured: 0.02 s)
# Every process the test config's stack runs with one pod: Redis, the pods, collector, picker, Envoy.
STACK_PROCESSES = {"stack", "redis", "sim", "collector", "picker", "envoy"}


@pytest.fixture
def runner_on_free_ports(tmp_path: Path) -> tuple[list[str], Path]:
    config, ports = config_on_free_ports(tmp_path, pods=1)
    run_dir = tmp_path / "run"
    return stack_cli_argv(config, ports, run_dir), run_dir


def _reported_everything(runner: StackRunner) -> dict[str, int]:
    """The PIDs in pids.json, checked against what actually runs under the runner."""
    pids = runner.pids()
    assert set(pids) == STACK_PROCESSES, pids
    assert pids["stack"] == runner.process.pid
    children = {p.pid for p in psutil.Process(runner.process.pid).children(recursive=True)}
    assert children == set(pids.values()) - {runner.process.pid}, (children, pids)
    return pids


def test_a_sigkilled_runner_takes_every_child_with_it(runner_on_free_ports: tuple[list[str], Path]) -> None:
    argv, run_dir = runner_on_free_ports
    runner = StackRunner(argv, run_dir)
    try:
        runner.wait_for_banner()
        pids = _reported_everything(runner)
        killed = time.monotonic()
        runner.process.kill()
        assert runner.process.wait(timeout=10) == -signal.SIGKILL
        left = survivors(pids, timeout=SURVIVAL_BOUND)
        gone_in = time.monotonic() - killed
        print(f"measured: runner SIGKILLed, its {len(pids) - 1} children gone in {gone_in:.2f} s")
        assert not left, f"outlived the runner by {SURVIVAL_BOUND} s: {left}"
    finally:
        runner.close()


def test_two_sigterms_back_to_back_stop_the_stack_once_and_cleanly(
    runner_on_free_ports: tuple[list[str], Path],
) -> None:
    argv, run_dir = runner_on_free_ports
    runner = StackRunner(argv, run_dir)
    try:
        runner.wait_for_banner()
        pids = _reported_everything(runner)
        signalled = time.monotonic()
        runner.process.send_signal(signal.SIGTERM)
        runner.process.send_signal(signal.SIGTERM)
        assert runner.process.wait(timeout=30) == 0, runner.output
        print(f"measured: two SIGTERMs, the stack stopped in {time.monotonic() - signalled:.2f} s")
        assert not survivors(pids, timeout=SURVIVAL_BOUND)
        assert runner.output.count("SIGTERM: stopping") == 1, runner.output
        assert "Traceback" not in runner.output, runner.output
    finally:
        runner.close()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_sigterm_to_the_group_under_make_stops_the_stack_cleanly(
    runner_on_free_ports: tuple[list[str], Path], tmp_path: Path
) -> None:
    """`kill -TERM -- -PGID` of a `make run`: the runner gets the group's SIGTERM and make's forwarded one."""
    argv, run_dir = runner_on_free_ports
    makefile = tmp_path / "Makefile"
    makefile.write_text(f"run:\n\t{shlex.join(argv)}\n", encoding="utf-8")
    make = StackRunner(["make", "-s", "-f", str(makefile), "run"], run_dir, new_session=True)
    try:
        make.wait_for_banner()
        pids = make.pids()
        assert psutil.Process(pids["stack"]).ppid() == make.process.pid  # make runs the runner
        assert os.getpgid(pids["stack"]) == make.process.pid  # in make's group
        signalled = time.monotonic()
        subprocess.run(["kill", "-TERM", "--", f"-{make.process.pid}"], check=True)
        make.process.wait(timeout=30)
        print(f"measured: SIGTERM to make's group, the stack stopped in {time.monotonic() - signalled:.2f} s")
        assert not survivors(pids, timeout=SURVIVAL_BOUND)
        assert make.output.count("SIGTERM: stopping") == 1, make.output
        assert "Traceback" not in make.output, make.output
    finally:
        make.close()


def test_two_sigterms_while_the_stack_starts_stop_what_started(
    runner_on_free_ports: tuple[list[str], Path],
) -> None:
    argv, run_dir = runner_on_free_ports
    runner = StackRunner(argv, run_dir)
    try:
        # The pods run, the collector is starting: signals land in the middle of start-up.
        runner.wait_for(lambda: "collector" in runner.pids(), "the collector started")
        pids = runner.pids()
        signalled = time.monotonic()
        runner.process.send_signal(signal.SIGTERM)
        runner.process.send_signal(signal.SIGTERM)
        assert runner.process.wait(timeout=30) == 0, runner.output
        stopped_in = time.monotonic() - signalled
        print(f"measured: two SIGTERMs during start-up, the stack stopped in {stopped_in:.2f} s")
        pids |= runner.pids()  # anything started before the stop was noticed
        assert not survivors(pids, timeout=SURVIVAL_BOUND)
        assert BANNER_DONE not in runner.output
        assert "Traceback" not in runner.output, runner.output
    finally:
        runner.close()
