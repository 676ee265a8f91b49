"""The config file, watched: a valid change is swapped in between two requests; an invalid one is
refused with a log line naming the bad path, and the running config stays.

Polling the file's modification time and size (once a second by default) needs no inotify and sees
Kubernetes ConfigMap updates, which replace the file through a symlink swap.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

from pointsman_shared.config import ConfigError, PointsmanConfig

log = logging.getLogger(__name__)

Load = Callable[[Path], tuple[PointsmanConfig, list[str]]]  # the config, and warnings to log
Apply = Callable[[PointsmanConfig], None]


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


class ConfigWatcher:
    """Loads the file once its stamp (mtime, size) has changed and then held still for one interval: a
    file being written in parts is not read half-written. A refused change is logged with its path and
    reason, counted, and the running config stays; nothing stops the watching."""

    def __init__(
        self,
        path: Path,
        load: Load,
        apply: Apply,
        *,
        interval: float = 1.0,
        on_result: Callable[[str], None] | None = None,
    ) -> None:
        self._path = path
        self._load = load
        self._apply = apply
        self._interval = interval
        self._on_result = on_result  # told "applied" or "refused" after each load
        self._stamp = _stamp(path)
        self._settling: tuple[int, int] | None = None

    def check(self) -> bool:
        """Look once; ``True`` when a changed, valid config was applied."""
        stamp = _stamp(self._path)
        if stamp is None or stamp == self._stamp:
            self._settling = None
            return False
        if stamp != self._settling:
            self._settling = stamp  # changed since the last look: the writer may not be done
            return False
        self._stamp, self._settling = stamp, None
        try:
            config, warnings = self._load(self._path)
        except ConfigError as exc:
            log.error("config change refused, the running config stays: %s", exc)
            self._result("refused")
            return False
        except Exception:
            log.exception("config change refused, the running config stays: %s cannot be loaded", self._path)
            self._result("refused")
            return False
        for warning in warnings:
            log.warning("%s", warning)
        self._apply(config)
        self._result("applied")
        return True

    def _result(self, result: str) -> None:
        if self._on_result is not None:
            self._on_result(result)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                self.check()
            except Exception:  # the watch must outlive any one change (apply included)
                log.exception("config watch: checking %s failed; watching on", self._path)
