"""Which pods to scrape: the sources of endpoints, and their union.

Each source is a :class:`TargetSource`: the config's list (:class:`StaticTargets`), a file of endpoints
re-read when it changes (:class:`FileTargets`), or an InferencePool
(:class:`~pointsman_collector.kubernetes.KubernetesTargets`). :class:`Sources` merges them.

The file holds one ``host[:port]`` per line (``pool.targetPort`` when the port is left out); blank lines
and ``#`` comments are ignored. Watching is a poll of the file's ``stat``: cheap, and it works the same
for a ConfigMap volume (an atomic symlink swap) as for an edited file. A file that cannot be read or
parsed leaves the previous set in place, so a half-written edit never empties the pool.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from pointsman_collector.errors import DiscoveryError
from pointsman_shared.config import join_host_port, split_host_port

log = logging.getLogger(__name__)

POLL = 1.0

# (mtime_ns, size, inode): what changes when the file is edited or replaced.
_Stamp = tuple[int, int, int]

OnChange = Callable[[tuple[str, ...]], None]


class TargetSource(Protocol):
    """One source of the pool's endpoints."""

    @property
    def name(self) -> str:
        """Its key in :class:`Sources`: ``config``, ``file``, ``kubernetes``."""
        ...

    async def follow(self, on_change: OnChange) -> None:
        """Call ``on_change`` with the first set as soon as it is known (an empty one too), then with
        each change, until cancelled. Failures are this source's to log and retry."""
        ...


class StaticTargets:
    """A fixed list: the config's ``pool.endpoints``, or a test's."""

    def __init__(self, endpoints: tuple[str, ...], *, name: str = "config") -> None:
        self.name = name
        self.endpoints = endpoints

    async def follow(self, on_change: OnChange) -> None:
        on_change(self.endpoints)


def parse_endpoints(text: str, default_port: int) -> tuple[str, ...]:
    """The endpoints of a file's text, normalized and in order; raise :class:`DiscoveryError`."""
    found: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        try:
            address = join_host_port(*split_host_port(entry, default_port))
        except ValueError as exc:
            raise DiscoveryError("file", f"line {number}: {exc}") from None
        if address not in found:
            found.append(address)
    return tuple(found)


class FileTargets:
    """Polls an endpoints file and calls ``on_change`` with the config's endpoints plus the file's.

    Call :meth:`refresh` once before :meth:`watch` for the first set (``endpoints``), or :meth:`follow`
    for both, as a :class:`TargetSource`.
    """

    name = "file"

    def __init__(
        self,
        path: str | Path,
        *,
        static: tuple[str, ...],
        default_port: int,
        on_change: OnChange | None = None,
        poll: float = POLL,
    ) -> None:
        self._path = Path(path)
        self._static = static
        self._default_port = default_port
        self._on_change = on_change
        self._poll = poll
        self._stamp: _Stamp | None = None
        self._error: str | None = None
        self.endpoints: tuple[str, ...] = static

    def refresh(self) -> bool:
        """Re-read the file if it changed; return whether the endpoint set changed."""
        try:
            stat = os.stat(self._path)
            stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
            if stamp == self._stamp:
                return False
            text = self._path.read_text(encoding="utf-8")
            from_file = parse_endpoints(text, self._default_port)
        except (OSError, UnicodeDecodeError, DiscoveryError) as exc:
            message = str(exc)
            if message != self._error:  # one line per problem, not one per poll
                log.warning(
                    "endpoints file %s: %s; keeping %d pods", self._path, message, len(self.endpoints)
                )
            self._error = message
            return False
        self._stamp = stamp
        self._error = None
        endpoints = tuple(dict.fromkeys((*self._static, *from_file)))
        if endpoints == self.endpoints:
            return False
        log.info("endpoints file %s: %d pods", self._path, len(from_file))
        self.endpoints = endpoints
        return True

    async def watch(self) -> None:
        """Refresh every ``poll`` seconds until cancelled, calling ``on_change`` on each change."""
        while True:
            await asyncio.sleep(self._poll)
            if self.refresh() and self._on_change is not None:
                self._on_change(self.endpoints)

    async def follow(self, on_change: OnChange) -> None:
        """Read the file now, report its set to ``on_change``, then :meth:`watch` until cancelled."""
        self._on_change = on_change
        self.refresh()
        on_change(self.endpoints)
        await self.watch()


class Sources:
    """The union of the endpoint lists of several sources (config, file, Kubernetes), in order.

    Updates before :meth:`connect` are only stored, so the collector can start with a complete first
    set; after it, every update is pushed at once.
    """

    def __init__(self) -> None:
        self._lists: dict[str, tuple[str, ...]] = {}
        self._apply: OnChange | None = None

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e for endpoints in self._lists.values() for e in endpoints))

    def update(self, source: str, endpoints: tuple[str, ...]) -> None:
        self._lists[source] = endpoints
        if self._apply is not None:
            self._apply(self.endpoints)

    def connect(self, apply: OnChange) -> None:
        self._apply = apply
        apply(self.endpoints)
