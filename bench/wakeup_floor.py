"""The floor under a streamed token's cost in the picker: what one read and one answer cost a Python
server on uvloop that does nothing else, so the per-event figure of `make bench-picker` can be split
into this and the picker's own work.

A server process (uvloop, an ``asyncio.Protocol`` whose ``data_received`` writes a fixed answer) and
a client process on one TCP connection over loopback; the client sends a message of ``--size`` bytes
(a token's DATA frame is about 200), waits for the answer, then sleeps ``--gap`` seconds, so that each
message reaches a server asleep in ``epoll_wait``, as a token does when tokens come apart. With
``--batch N`` the client sends N messages in one write (the server answers them in one write too),
which is what a busier Envoy does. The server's user and system CPU over ``--messages`` messages,
per message, is the result (``/proc``, clock ticks: run enough messages).

    .venv/bin/python bench/wakeup_floor.py [--messages 20000] [--gap 0.0002] [--batch 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ANSWER = b"\x00\x00\x05\x00\x00\x00\x00\x00\x01" + b"\x00\x00\x00\x00\x02\x2a\x00"  # a DATA frame's size


def serve(size: int) -> None:
    import uvloop

    class Answer(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.pending = 0

        def data_received(self, data: bytes) -> None:
            # One answer per whole message in the read, all in one write (as the picker's reads do).
            self.pending += len(data)
            count, self.pending = divmod(self.pending, size)
            if count:
                self.transport.write(ANSWER * count)  # type: ignore[attr-defined]

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Answer, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)  # the port, for the client
        await asyncio.Event().wait()

    uvloop.run(main())


def cpu_ticks(pid: int) -> tuple[int, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=200, help="bytes a message")
    parser.add_argument("--gap", type=float, default=0.0002, help="seconds between sends")
    parser.add_argument("--batch", type=int, default=1, help="messages a write")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.size)
        return 0
    argv = [sys.executable, __file__, "--serve", "--size", str(args.size)]
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        client = socket.create_connection(("127.0.0.1", int(server.stdout.readline())))
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        message = b"m" * args.size * args.batch
        answer = len(ANSWER) * args.batch
        rounds = args.messages // args.batch
        load = os.getloadavg()
        user, system = cpu_ticks(server.pid)
        for _ in range(rounds):
            client.sendall(message)
            got = 0
            while got < answer:
                got += len(client.recv(65536))
            time.sleep(args.gap)
        user_after, system_after = cpu_ticks(server.pid)
    finally:
        server.kill()
        server.wait()
    tick = 1e6 / os.sysconf("SC_CLK_TCK")
    messages = rounds * args.batch
    result = {
        "messages": messages,
        "batch": args.batch,
        "us_per_message": {
            "user": round((user_after - user) * tick / messages, 2),
            "system": round((system_after - system) * tick / messages, 2),
        },
        "load_average": [round(x, 2) for x in load],
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
