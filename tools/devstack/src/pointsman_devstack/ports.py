"""Free loopback ports for the local stack and the tests.

A port found by binding port 0 comes from the kernel's ephemeral range, the same range outgoing
connections take their source ports from: between handing the port out and the service binding it,
a scrape or a Redis connection can take it ("Address already in use", seen in CI). So ports are
handed out from below that range, each at most once per process, and only if they bind right now.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from collections.abc import Collection, Iterator
from pathlib import Path

_FLOOR = 10_000  # below this live well-known services (and the local stack's fixed defaults)
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_floor() -> int:
    """The lowest port the kernel picks for outgoing connections (IANA's 49152 where unknown)."""
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49_152


def _candidates() -> Iterator[int]:
    # One sweep per process from a random start (by PID, so parallel test processes spread out);
    # each port is offered once, so two callers in one process never get the same port.
    ceiling = ephemeral_floor()
    span = ceiling - _FLOOR
    start = random.Random(os.getpid()).randrange(span)
    for offset in itertools.count():
        if offset >= span:
            return
        yield _FLOOR + (start + offset) % span


_PORTS = _candidates()  # process-wide on purpose: "once per process" needs one sweep per process


def bindable(port: int) -> bool:
    """Whether ``port`` binds on loopback right now."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(avoid: Collection[int] = ()) -> int:
    """A loopback port that binds now; ``avoid`` holds ports already promised to someone else (a
    config's ports, handed out by another process but not yet bound)."""
    for port in _PORTS:
        if port not in avoid and bindable(port):
            return port
    raise RuntimeError("no free loopback port below the ephemeral range")
