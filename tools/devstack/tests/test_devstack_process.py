from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil
import pytest

from pointsman_devstack.errors import StackError
from pointsman_devstack.process import ManagedProcess
from pointsman_devstack.readiness import wait_ready


def _python(
    tmp_path: Path, code: str, *, name: str = "child", echo: list[str] | None = None
) -> ManagedProcess:
    def collect(process: str, line: str) -> None:
        assert echo is not None
        echo.append(f"{process}: {line}")

    return ManagedProcess(
        name,
        [sys.executable, "-u", "-c", code],
        env={"PATH": "/usr/bin:/bin"},
        log_path=tmp_path / f"{name}.log",
        echo=collect if echo is not None else None,
    )


def _wait_exit(process: ManagedProcess, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while (code := process.returncode) is None:
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.01)
    return code


def test_output_goes_to_the_log_the_tail_and_the_echo(tmp_path: Path) -> None:
    echoed: list[str] = []
    process = _python(tmp_path, "import sys; print('one'); print('two', file=sys.stderr)", echo=echoed)
    assert _wait_exit(process) == 0
    process.stop(grace=1)
    assert process.tail() == ["one", "two"]
    assert echoed == ["child: one", "child: two"]
    assert (tmp_path / "child.log").read_text() == "one\ntwo\n"


def test_stop_kills_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up'); time.sleep(60)"
    process = _python(tmp_path, code)
    _wait_for_line(process, "up")
    started = time.monotonic()
    process.stop(grace=0.3)
    assert process.returncode == -9
    assert time.monotonic() - started < 5
    process.stop(grace=0.3)  # idempotent


def test_stop_reaches_what_the_child_spawned(tmp_path: Path) -> None:
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(p.pid, flush=True); time.sleep(60)"
    )
    process = _python(tmp_path, code)
    grandchild = psutil.Process(int(_wait_for_line(process, "")))
    process.stop(grace=1)
    grandchild.wait(timeout=5)
    assert not grandchild.is_running()


def test_wait_ready_returns_once_the_probe_passes(tmp_path: Path) -> None:
    process = _python(tmp_path, "import time; time.sleep(60)")
    answers = iter(["starting", "starting", None])
    try:
        wait_ready(process, lambda: next(answers), timeout=5, what="ready", interval=0.001)
    finally:
        process.stop(grace=1)


def test_wait_ready_names_a_process_that_died_and_shows_its_output(tmp_path: Path) -> None:
    process = _python(tmp_path, "import sys; print('bind: address already in use'); sys.exit(3)", name="sim")
    _wait_exit(process)
    with pytest.raises(StackError, match=r"sim exited with code 3 before /health") as caught:
        wait_ready(process, lambda: "refused", timeout=5, what="/health")
    assert "bind: address already in use" in str(caught.value)
    assert caught.value.log_path == str(tmp_path / "sim.log")
    process.stop(grace=1)


def test_wait_ready_times_out_with_the_last_probe_result(tmp_path: Path) -> None:
    process = _python(tmp_path, "print('waiting for redis'); import time; time.sleep(60)", name="collector")
    try:
        with pytest.raises(
            StackError, match=r"collector: no /readyz 200 within 0.2s \(last probe: HTTP 503\)"
        ):
            wait_ready(process, lambda: "HTTP 503", timeout=0.2, what="/readyz 200")
    finally:
        process.stop(grace=1)


def _wait_for_line(process: ManagedProcess, prefix: str, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in process.tail():
            if line.startswith(prefix):
                return line
        time.sleep(0.01)
    raise AssertionError(f"no line starting with {prefix!r}: {process.tail()}")


def test_a_hurried_stop_does_not_wait_out_the_grace(tmp_path: Path) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up'); time.sleep(60)"
    process = _python(tmp_path, code)
    _wait_for_line(process, "up")
    calls = iter([False, False, True])
    started = time.monotonic()
    process.stop(grace=30, hurry=lambda: next(calls, True))
    assert process.returncode == -9
    assert time.monotonic() - started < 5


def test_kill_is_a_sigkill_now(tmp_path: Path) -> None:
    process = _python(tmp_path, "import time; print('up'); time.sleep(60)")
    _wait_for_line(process, "up")
    process.kill()
    assert process.returncode == -9
    process.kill()
    process.stop(grace=1)  # both idempotent, together too
