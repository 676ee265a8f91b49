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
    def __init__(self, path: Path, load: Load, apply: Apply, *, interval: float = 1.0) -> None:
        self._path = path
        self._load = load
        self._apply = apply
        self._interval = interval
        self._stamp = _stamp(path)

    def check(self) -> bool:
        """Look once; ``True`` when a changed, valid config was applied."""
        stamp = _stamp(self._path)
        if stamp is None or stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            config, warnings = self._load(self._path)
        except ConfigError as exc:
            log.error("config change refused, the running config stays: %s", exc)
            return False
        for warning in warnings:
            log.warning("%s", warning)
        self._apply(config)
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            self.check()
