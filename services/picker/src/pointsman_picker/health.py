"""The picker's gRPC health, as upstream's endpoint picker names it, on both ports.

``liveness`` is SERVING while the process serves (a picker waiting for Redis must not be restarted
for it); ``readiness``, ``""``, ``inference-extension`` and the ExternalProcessor service turn SERVING
with the first fresh snapshot (published within ``picker.maxStaleness``) and stay so until shutdown,
when every service turns NOT_SERVING. :class:`HealthBoard` holds the statuses; the native server
answers Check and Watch from it, grpc.aio's health servicer is kept in step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2

from pointsman_picker.h2grpc.calls import Method, ServerStream, Status

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS = "liveness"
READINESS_SERVICES = ("", "readiness", "inference-extension", EXT_PROC_SERVICE)
SERVICES = (LIVENESS, *READINESS_SERVICES)
HEALTH_CHECK_PATH = "/grpc.health.v1.Health/Check"
HEALTH_WATCH_PATH = "/grpc.health.v1.Health/Watch"

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class Watcher(Protocol):
    def changed(self, status: int) -> None: ...

    def end(self) -> None:
        """The server is going away: finish the call."""


class HealthBoard:
    """Each service's status, and who watches which."""

    def __init__(self) -> None:
        self._statuses: dict[str, int] = dict.fromkeys(SERVICES, NOT_SERVING)
        self._watchers: dict[str, set[Watcher]] = {}

    def get(self, service: str) -> int | None:
        return self._statuses.get(service)

    def items(self) -> list[tuple[str, int]]:
        return list(self._statuses.items())

    def set(self, service: str, status: int) -> None:
        if self._statuses.get(service) == status:
            return
        self._statuses[service] = status
        for watcher in list(self._watchers.get(service, ())):
            watcher.changed(status)

    def live(self) -> None:
        self.set(LIVENESS, SERVING)

    def ready(self) -> None:
        for service in READINESS_SERVICES:
            self.set(service, SERVING)

    def shut_down(self) -> None:
        """Every service NOT_SERVING, told to its watchers, whose calls then end (a Watch would
        otherwise hold a graceful shutdown for its whole grace)."""
        for service in SERVICES:
            self.set(service, NOT_SERVING)
        watchers = [w for group in self._watchers.values() for w in group]
        self._watchers.clear()
        for watcher in watchers:
            watcher.end()

    def watch(self, service: str, watcher: Watcher) -> Callable[[], None]:
        """Tell ``watcher`` each new status of ``service``; returns what stops it."""
        self._watchers.setdefault(service, set()).add(watcher)
        return lambda: self._watchers.get(service, set()).discard(watcher)

    @property
    def watchers(self) -> int:
        return sum(len(w) for w in self._watchers.values())


def _service_of(request: bytes | None) -> str | None:
    try:
        return str(health_pb2.HealthCheckRequest.FromString(request or b"").service)
    except DecodeError:
        return None


def _answer(status: int) -> bytes:
    return bytes(health_pb2.HealthCheckResponse(status=status).SerializeToString())


class _HealthCall:
    """A health call: one HealthCheckRequest, then :meth:`asked` with its service (a request that does
    not decode is INVALID_ARGUMENT)."""

    __slots__ = ("_board", "_request", "_server_stream")

    def __init__(self, board: HealthBoard, server_stream: ServerStream) -> None:
        self._board = board
        self._server_stream = server_stream
        self._request: bytes | None = None

    def message(self, payload: bytes) -> None:
        self._request = payload

    def half_closed(self) -> None:
        service = _service_of(self._request)
        if service is None:
            self._server_stream.finish(Status.INVALID_ARGUMENT, "not a HealthCheckRequest")
        else:
            self.asked(service)

    def asked(self, service: str) -> None:
        raise NotImplementedError

    def cancelled(self) -> None:
        pass


class _Check(_HealthCall):
    """grpc.health.v1 Check: one answer from the board."""

    __slots__ = ()

    def asked(self, service: str) -> None:
        status = self._board.get(service)
        if status is None:
            self._server_stream.finish(Status.NOT_FOUND, f"unknown service {service!r}")
            return
        self._server_stream.send(_answer(status))
        self._server_stream.finish()


class _Watch(_HealthCall):
    """grpc.health.v1 Watch: the status now, then each change, until the client goes or shutdown. An
    unknown service is SERVICE_UNKNOWN (and may become known), as gRPC's own servicers answer."""

    __slots__ = ("_stop",)

    def __init__(self, board: HealthBoard, server_stream: ServerStream) -> None:
        super().__init__(board, server_stream)
        self._stop: Callable[[], None] | None = None

    def asked(self, service: str) -> None:
        status = self._board.get(service)
        self._server_stream.send(_answer(SERVICE_UNKNOWN if status is None else status))
        self._stop = self._board.watch(service, self)

    def changed(self, status: int) -> None:
        self._server_stream.send(_answer(status))

    def end(self) -> None:
        self._stop = None
        self._server_stream.finish(Status.UNAVAILABLE, "the picker is shutting down")

    def cancelled(self) -> None:
        if self._stop is not None:
            self._stop()
            self._stop = None


def health_methods(board: HealthBoard) -> dict[str, Method]:
    return {
        HEALTH_CHECK_PATH: lambda server_stream: _Check(board, server_stream),
        HEALTH_WATCH_PATH: lambda server_stream: _Watch(board, server_stream),
    }
