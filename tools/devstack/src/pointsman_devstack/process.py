"""One child process of the stack: its own process group, its output in a log file, a bounded stop."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from pointsman_devstack.errors import StackError

Echo = Callable[[str, str], None]  # (process name, output line)


class ManagedProcess:
    """A started child. Output (stdout and stderr merged) goes to ``log_path`` and, if given, to ``echo``.

    The child leads a new session, so a Ctrl-C in the terminal reaches only the stack, which then stops
    the children in order; and a stop signal reaches whatever the child spawned itself.
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
                self.argv,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError:
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

    def stop(self, grace: float) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds; safe to call twice."""
        if self._stopped:
            return
        if self._popen.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self._popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self._popen.wait()
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
