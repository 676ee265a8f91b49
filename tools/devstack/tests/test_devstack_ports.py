from __future__ import annotations

import socket

from pointsman_devstack.ports import ephemeral_floor, free_port


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(10_000 <= port < ephemeral_floor() for port in ports)
    for port in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
