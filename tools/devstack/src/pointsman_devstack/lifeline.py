"""Children that die with the stack: Linux's parent-death signal, set in the child before it execs.

Every child of the stack leads a session of its own (so a Ctrl-C in the terminal reaches only the
stack, which stops them in order), which also means nothing reaches them when the stack itself dies
without stopping them: SIGKILL, an OOM kill, a crash. ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` makes the
kernel kill a child when its parent dies, and it survives ``execve``; but it must be set *in the child*.

How, without ``preexec_fn``: that runs Python in the forked child before exec, which is unsafe while
other threads run (the output pumps do; a lock one of them held at the fork stays locked in the child
for good). Instead :func:`tied_to_parent` puts a tiny interpreter in front of the program:
``python -I -S -c GUARD <parent pid> <signal> <program> <args...>``. The guard sets the death signal,
checks that its parent is still the stack (if the stack died between fork and prctl, the parent is now
init or a subreaper and the guard exits instead of starting an orphan), then ``execv``s the program:
same PID, same session, same environment, 15 ms of start-up. The program is resolved on the child's
``PATH`` here, so a missing binary is still an immediate ``FileNotFoundError``, not a child that exits.

Why SIGKILL, not SIGTERM: the signal only fires when the stack is gone, so nobody reads the child's
output any more, and a graceful stop (the pods drain for up to 5 s, the picker for its grace) would
only keep it around longer; what must hold is that nothing survives. A stack that is alive stops its
children gracefully itself.

The kernel sends the signal when the *thread* that forked the child ends, not the process: a child
started from a worker thread would be killed as soon as that thread returns. :func:`tied_to_parent`
therefore refuses to run off the main thread.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sys
import threading
from collections.abc import Mapping, Sequence

from pointsman_devstack.errors import StackError

# argv: parent pid, signal number, program, its argv[1:]. Exit 70 (EX_SOFTWARE) when prctl fails, 75
# (EX_TEMPFAIL) when the parent is already gone: neither starts the program.
_GUARD = """\
import ctypes, os, sys
parent, signum, program = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(1, ctypes.c_ulong(signum), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
    print("lifeline: prctl(PR_SET_PDEATHSIG):", os.strerror(ctypes.get_errno()), file=sys.stderr)
    sys.exit(70)
if os.getppid() != parent:
    print("lifeline: the stack exited before", program, "started; not starting it", file=sys.stderr)
    sys.exit(75)
os.execv(program, sys.argv[3:])
"""

SUPPORTED = sys.platform.startswith("linux")


def tied_to_parent(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    parent: int | None = None,
    signum: int = signal.SIGKILL,
) -> list[str]:
    """The argv that runs ``argv`` so that it gets ``signum`` when this process (``parent``) dies.

    Raises ``FileNotFoundError`` when ``argv[0]`` is not found on ``env``'s ``PATH``, and
    :class:`StackError` off the main thread. Off Linux, ``argv`` as it is (no parent-death signal).
    """
    if not argv:
        raise ValueError("an empty argv")
    if not SUPPORTED:
        return list(argv)
    if threading.current_thread() is not threading.main_thread():
        raise StackError(
            f"start {argv[0]} from the main thread: the parent-death signal fires when the thread that "
            "started a child ends, so a child of this thread would die with it"
        )
    program = shutil.which(argv[0], path=env.get("PATH", os.defpath))
    if program is None:
        raise FileNotFoundError(errno.ENOENT, "no such program on the child's PATH", argv[0])
    pid = os.getpid() if parent is None else parent
    return [sys.executable, "-I", "-S", "-c", _GUARD, str(pid), str(int(signum)), program, *argv[1:]]
