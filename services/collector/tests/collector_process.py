"""The real ``pointsman-collector`` as a child process, for tests of the process itself: its exit codes,
its signals, its console script. Everything else runs in-process (``assembly.create_collector``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

MODULE = (sys.executable, "-m", "pointsman_collector")
# The console script the package installs beside the interpreter.
CONSOLE_SCRIPT = (str(Path(sys.executable).with_name("pointsman-collector")),)


@dataclass
class CollectorRun:
    process: asyncio.subprocess.Process
    log: str = ""  # its stderr, once it has stopped


async def start_collector(config: Path, command: tuple[str, ...] = MODULE) -> asyncio.subprocess.Process:
    """The collector on ``config``, REDIS_URL unset so the config's Redis counts; stderr piped."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    return await asyncio.create_subprocess_exec(
        *command, "--config", str(config), env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


@contextlib.asynccontextmanager
async def running_collector(config: Path, command: tuple[str, ...] = MODULE) -> AsyncIterator[CollectorRun]:
    """The collector on ``config`` for the block; when it ends, SIGTERM it and collect its log; kill it
    if the block failed or it does not stop in 10 s."""
    process = await start_collector(config, command)
    run = CollectorRun(process)
    try:
        yield run
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(10):
            _, stderr = await process.communicate()
        run.log = stderr.decode()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
