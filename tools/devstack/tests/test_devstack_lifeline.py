from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from pointsman_devstack.errors import StackError
from pointsman_devstack.lifeline import tied_to_parent
from pointsman_devstack.process import ManagedProcess

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

ENV = {"PATH": os.environ.get("PATH", os.defpath)}


def _gone(pid: int, timeout: float = 5.0) -> bool:
    """Whether ``pid`` ended within ``timeout`` (a zombie nobody reaped yet counts as ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def test_a_child_dies_when_the_process_that_started_it_is_killed(tmp_path: Path) -> None:
    # The parent starts a ManagedProcess (sleeping for a minute), says its PID and waits to be killed.
    parent_code = (
        "import pathlib, sys, time\n"
        "from pointsman_devstack.process import ManagedProcess\n"
        "child = ManagedProcess('sleeper', [sys.executable, '-c', 'import time; time.sleep(60)'],\n"
        f"    env={ENV!r}, log_path=pathlib.Path({str(tmp_path / 'sleeper.log')!r}))\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    with subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True) as parent:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        # The guard has exec'd the program: same PID, the program's command line.
        deadline = time.monotonic() + 5
        while "time.sleep(60)" not in " ".join(psutil.Process(child).cmdline()):
            assert time.monotonic() < deadline, psutil.Process(child).cmdline()
            time.sleep(0.01)
        assert psutil.Process(child).ppid() == parent.pid
        parent.kill()
        parent.wait()
    assert _gone(child), f"{child} outlived its parent"


def test_the_guard_starts_nothing_when_its_parent_is_already_gone(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    argv = tied_to_parent([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], ENV, parent=1)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    assert done.returncode == 75
    assert "the stack exited before" in done.stderr
    assert not marker.exists()


def test_the_guard_passes_arguments_and_environment_through(tmp_path: Path) -> None:
    code = "import os, sys; print(sys.argv[1:], os.environ['ONLY'])"
    argv = tied_to_parent([sys.executable, "-c", code, "a b", "--c"], {**ENV, "ONLY": "x"})
    done = subprocess.run(argv, env={**ENV, "ONLY": "x"}, capture_output=True, text=True, check=True)
    assert done.stdout == "['a b', '--c'] x\n"


def test_the_death_signal_is_set_in_the_program_it_execs() -> None:
    # /proc/self/status has no PDEATHSIG line; prctl(PR_GET_PDEATHSIG) from inside the program tells.
    code = (
        "import ctypes; v = ctypes.c_int(); "
        "ctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0); print(v.value)"
    )
    argv = tied_to_parent([sys.executable, "-c", code], ENV)
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert int(done.stdout) == signal.SIGKILL


def test_a_missing_program_fails_at_once_not_in_the_child(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no-such-program"):
        ManagedProcess("x", ["no-such-program"], env=ENV, log_path=tmp_path / "x.log")


def test_children_are_started_from_the_main_thread_only(tmp_path: Path) -> None:
    errors: list[BaseException] = []

    def start() -> None:
        try:
            ManagedProcess("x", [sys.executable, "-c", "pass"], env=ENV, log_path=tmp_path / "x.log")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    [error] = errors
    assert isinstance(error, StackError)
    assert "main thread" in str(error)
