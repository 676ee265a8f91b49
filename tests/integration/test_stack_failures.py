"""A stack that cannot start says which process failed and why, and leaves nothing running."""

from __future__ import annotations

import socket
from pathlib import Path

import psutil
import pytest
from integration_kit import TEST_CONFIG, stack_environ

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
