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


def test_a_promised_port_is_never_handed_out() -> None:
    first = free_port()
    # The sweep moves on, so promise the next ports and check none comes back.
    promised = set(range(first + 1, first + 40))
    assert not promised & {free_port(promised) for _ in range(20)}
