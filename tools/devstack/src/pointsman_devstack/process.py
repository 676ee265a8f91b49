"""One child process of the stack: its own session, its output in a log file, a bounded stop, and a
parent-death signal (:mod:`pointsman_devstack.lifeline`) so it never outlives the stack."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from pointsman_devstack.errors import StackError
from pointsman_devstack.lifeline import tied_to_parent

Echo = Callable[[str, str], None]  # (process name, output line)
# A stop waits for the process in slices this long, looking for a reason to hurry in between.
_STOP_SLICE = 0.05


class ManagedProcess:
    """A started child. Output (stdout and stderr merged) goes to ``log_path`` and, if given, to ``echo``.

    The child leads a new session, so a Ctrl-C in the terminal reaches only the stack, which then stops
    the children in order; and a stop signal reaches whatever the child spawned itself. It gets SIGKILL
    when the stack dies (the thread that created it must be the main thread, see ``lifeline``).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log_path: Path,
        echo: Echo | None = None,
        tail_lines: int = 40,
    ) -> None:
        self.name = name
        self.argv = tuple(argv)
        self.log_path = log_path
        self._echo = echo
        self._tail: deque[str] = deque(maxlen=tail_lines)
        self._log: IO[str] = log_path.open("w", encoding="utf-8")
        # The output thread may outlive a stop() whose join timed out; the lock keeps it off a closed file.
        self._log_lock = threading.Lock()
        self._stopped = False
        try:
            self._popen = subprocess.Popen(
                tied_to_parent(self.argv, env),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except BaseException:
            self._log.close()
            raise
        self._pump = threading.Thread(target=self._copy_output, name=f"{name}-output", daemon=True)
        self._pump.start()

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    def error(self, message: str) -> StackError:
        """A :class:`StackError` about this process, with the last lines of its output."""
        return StackError(message, log_tail=self.tail(), log_path=str(self.log_path))

    def tail(self) -> list[str]:
        """The last lines the process wrote."""
        return list(self._tail)

    def stop(self, grace: float, *, hurry: Callable[[], bool] = lambda: False) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds or as soon as ``hurry()`` is
        true; safe to call twice."""
        if self._stopped:
            return
        if self._popen.poll() is None:
            self._signal(signal.SIGTERM)
            deadline = time.monotonic() + grace
            while self._popen.poll() is None and time.monotonic() < deadline and not hurry():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._popen.wait(timeout=min(_STOP_SLICE, max(0.0, deadline - time.monotonic())))
            if self._popen.poll() is None:
                self._signal(signal.SIGKILL)
                self._popen.wait()
        self._close()

    def kill(self) -> None:
        """SIGKILL the process group now (a crash, for fault tests); safe to call twice."""
        if self._stopped:
            return
        self._signal(signal.SIGKILL)
        self._popen.wait()
        self._close()

    def _close(self) -> None:
        # Children the process left behind in its group.
        self._signal(signal.SIGKILL)
        self._pump.join(timeout=5)
        with self._log_lock:
            self._log.close()
        self._stopped = True

    def _signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, signum)

    def _copy_output(self) -> None:
        stream = self._popen.stdout
        assert stream is not None
        with stream:
            for raw in stream:
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                self._tail.append(line)
                with self._log_lock:
                    if not self._log.closed:
                        self._log.write(line + "\n")
                        self._log.flush()
                if self._echo is not None:
                    self._echo(self.name, line)
