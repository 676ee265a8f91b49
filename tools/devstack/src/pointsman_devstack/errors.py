"""What the stack raises: :class:`StackError` (what failed, and the last lines the failing process
wrote) and :class:`StackCancelled` (a stop was asked for while the stack was starting; not a failure)."""

from __future__ import annotations

from collections.abc import Sequence


class StackError(RuntimeError):
    def __init__(self, message: str, *, log_tail: Sequence[str] = (), log_path: str | None = None) -> None:
        self.log_tail = tuple(log_tail)
        self.log_path = log_path
        text = message
        if log_tail:
            where = f" ({log_path})" if log_path else ""
            text += f"\n--- last lines of its output{where} ---\n" + "\n".join(log_tail)
        super().__init__(text)


class StackCancelled(Exception):
    """:meth:`Stack.cancel <pointsman_devstack.stack.Stack.cancel>` was called while the stack started."""
