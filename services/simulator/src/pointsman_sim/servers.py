"""Serving several pods from one process: one uvicorn server per pod, all on one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack

import uvicorn

from pointsman_shared.tracing import Tracing
from pointsman_sim.app import create_app
from pointsman_sim.pod import SimPod
from pointsman_sim.request_tracing import RequestTracer

logger = logging.getLogger(__name__)

# On SIGINT/SIGTERM in-flight requests get this long to finish before the pods abort them.
DRAIN_SECONDS = 5.0
# uvicorn's own limit, a backstop only: aborted requests end at once, so it should never be reached.
_UVICORN_DRAIN_SECONDS = 10


class PodServer(uvicorn.Server):
    """A uvicorn server that leaves signals alone: one handler stops every pod's server at once."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: any free port); raises ``OSError``."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def pod_server(pod: SimPod, *, log_level: str = "warning", tracing: Tracing | None = None) -> PodServer:
    tracer = None
    if tracing is not None:
        tracer = RequestTracer(tracing.tracer("pointsman_sim"), pod=pod.name, speedup=pod.spec.speedup)
    config = uvicorn.Config(
        create_app(pod, tracer=tracer),
        lifespan="off",  # the pod's engine runs in `async with pod`, not in the app's lifespan
        access_log=False,
        log_config=None,  # keep the process's logging setup (main's basicConfig); set levels only
        log_level=log_level,
        timeout_graceful_shutdown=_UVICORN_DRAIN_SECONDS,
    )
    return PodServer(config)


async def serve_pods(
    pods: Sequence[SimPod],
    sockets: Sequence[socket.socket],
    *,
    log_level: str,
    tracing: Tracing | None = None,
) -> None:
    """Serve each pod on its socket until SIGINT or SIGTERM (with ``tracing``, each request's span).

    The first signal stops accepting connections and gives in-flight requests ``DRAIN_SECONDS`` to
    finish; then (or at a second signal) the pods abort the rest, which end with an error.
    """
    servers = [pod_server(pod, log_level=log_level, tracing=tracing) for pod in pods]
    loop = asyncio.get_running_loop()
    deadline: asyncio.TimerHandle | None = None

    def abort_in_flight() -> None:
        aborted = sum(pod.abort_all() for pod in pods)
        if aborted:
            logger.warning("aborted %d in-flight request(s) at shutdown", aborted)

    def on_signal() -> None:
        nonlocal deadline
        if deadline is not None:
            deadline.cancel()
            abort_in_flight()
            return
        logger.info("stopping: draining in-flight requests for up to %.0f s", DRAIN_SECONDS)
        for server in servers:
            server.should_exit = True
        deadline = loop.call_later(DRAIN_SECONDS, abort_in_flight)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        async with AsyncExitStack() as stack:
            # Entered first, left last: the engines keep stepping while the servers drain.
            for pod in pods:
                await stack.enter_async_context(pod)
            # A server that fails takes the others down with it.
            async with asyncio.TaskGroup() as group:
                for server, sock in zip(servers, sockets, strict=True):
                    group.create_task(server.serve(sockets=[sock]))
    finally:
        if deadline is not None:
            deadline.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if tracing is not None:  # the spans still queued go out
            await asyncio.to_thread(tracing.shutdown)
    logger.info("stopped %d pod(s)", len(pods))
