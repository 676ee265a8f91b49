"""Waiting for a started process to be ready, with probes that say why it is not (yet)."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pointsman_devstack.errors import StackCancelled
from pointsman_devstack.process import ManagedProcess

# None when ready, else why not (shown if the wait times out).
Probe = Callable[[], str | None]


def wait_ready(
    process: ManagedProcess,
    probe: Probe,
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
    cancelled: Callable[[], bool] = lambda: False,
) -> None:
    """Poll ``probe`` until it reports ready; fail early if ``process`` exits; raise
    :class:`StackCancelled` once ``cancelled()`` is true."""
    deadline = time.monotonic() + timeout
    reason = "not probed yet"
    while True:
        if cancelled():
            raise StackCancelled(f"stopped while waiting for {process.name}: {what}")
        code = process.returncode
        if code is not None:
            raise process.error(f"{process.name} exited with code {code} before {what}")
        reason = probe() or ""
        if not reason:
            return
        if time.monotonic() >= deadline:
            raise process.error(f"{process.name}: no {what} within {timeout:g}s (last probe: {reason})")
        time.sleep(interval)


def http_ok(client: httpx.Client, url: str) -> Probe:
    def probe() -> str | None:
        try:
            response = client.get(url)
        except httpx.HTTPError as exc:
            return f"GET {url}: {type(exc).__name__} {exc}"
        return None if response.status_code == 200 else f"GET {url}: HTTP {response.status_code}"

    return probe


def all_ready(probes: list[Probe]) -> Probe:
    def probe() -> str | None:
        for each in probes:
            reason = each()
            if reason:
                return reason
        return None

    return probe


def grpc_serving(address: str, service: str = "") -> Probe:
    """``grpc.health.v1.Health/Check`` answers SERVING for ``service`` ("" is the whole server)."""

    def probe() -> str | None:
        with grpc.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0)
            except grpc.RpcError as exc:
                return f"health check on {address}: {exc.code().name}"
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        return None if status == "SERVING" else f"health check on {address}: {status}"

    return probe
