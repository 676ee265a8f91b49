"""Instructions per gRPC call of the native server's sans-IO HTTP/2 protocol, counted by valgrind's
callgrind (deterministic, so two trees compare on a shared machine where wall-clock timings do not).

The request bytes are built once, beforehand (``hpack``'s encoder, its dynamic table as a client's),
and written to a file; each measured process loads them and feeds them to one ``H2Protocol``, calling
``data_to_send`` after every read, the method answering each message at once. Two shapes:

- ``unary``: one call per read: HEADERS, then one DATA frame with the request message and END_STREAM;
  answered with HEADERS, one DATA frame and the trailers;
- ``envoy``: whole ext_proc streams as Envoy sends them (``bench/h2grpc_protocol.py``'s ``stream``):
  HEADERS + the request-headers message, the body message, then END_STREAM and RST_STREAM in one read.

The messages, the method and the client's preface and headers are ``bench/h2grpc_protocol.py``'s.
Every tree must write the same bytes for the same reads, or the script stops.

Each (tree, shape) runs twice under callgrind, with ``--small`` and ``--large`` calls; instructions
per call are the difference over the difference in calls, so the interpreter's start, the imports and
the file's loading cancel out. ``PYTHONHASHSEED=0`` keeps the runs repeatable.

    .venv/bin/python bench/h2_cost.py                        # this tree
    .venv/bin/python bench/h2_cost.py --against /tmp/h2base  # and another checkout, in the same run

A tree is a checkout of the repository: its ``services/picker/src`` and ``shared/src`` are put first on
``PYTHONPATH`` for its runs (the packages this tree's .venv has installed serve both).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from h2grpc_protocol import BODY_MESSAGE, HEADERS_MESSAGE, PROCESS, Answer, client_preface, request_headers

ROOT = Path(__file__).resolve().parent.parent
_COLLECTED = re.compile(rb"==\d+== Collected : (\d+)")


def build_reads(shape: str, calls: int) -> list[bytes]:
    """The client's reads: its preface (wide windows, as Envoy's), then ``calls`` calls."""
    from hpack import Encoder

    from pointsman_picker.h2grpc import wire
    from pointsman_picker.h2grpc.wire import END_HEADERS, END_STREAM, ErrorCode, FrameType

    encoder = Encoder()
    reads = [client_preface()]
    for stream_id in range(1, 2 * calls, 2):
        headers = wire.frame(FrameType.HEADERS, END_HEADERS, stream_id, request_headers(encoder))
        if shape == "unary":
            request = wire.frame(FrameType.DATA, END_STREAM, stream_id, wire.grpc_message(HEADERS_MESSAGE))
            reads.append(headers + request)
            continue
        reads.append(headers + wire.frame(FrameType.DATA, 0, stream_id, wire.grpc_message(HEADERS_MESSAGE)))
        reads.append(wire.frame(FrameType.DATA, 0, stream_id, wire.grpc_message(BODY_MESSAGE)))
        reads.append(
            wire.frame(FrameType.DATA, END_STREAM, stream_id) + wire.rst_stream(stream_id, ErrorCode.CANCEL)
        )
    return reads


def feed(path: str) -> None:
    """The measured process: the reads in ``path`` through one protocol."""
    from pointsman_picker.h2grpc.protocol import H2Protocol

    with open(path, "rb") as file:
        reads: list[bytes] = pickle.load(file)
    protocol = H2Protocol({PROCESS.encode(): Answer}, max_message_bytes=8 * 1024 * 1024, clock=lambda: 0.0)
    receive, to_send = protocol.receive_data, protocol.data_to_send
    sent = 0
    for data in reads:
        receive(data)
        sent += len(to_send())
    if protocol.closing or protocol.open_streams:
        raise SystemExit(f"the protocol did not answer every call (closing={protocol.closing})")
    print(sent)


def instructions(tree: Path, reads_file: str) -> tuple[int, bytes]:
    """Instructions to feed the reads in ``reads_file`` to ``tree``'s protocol, and what it printed."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tree / "services/picker/src"), str(tree / "shared/src"), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    with tempfile.TemporaryDirectory() as scratch:
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={scratch}/callgrind.out",
                sys.executable,
                __file__,
                "--feed",
                reads_file,
            ],
            env=env,
            capture_output=True,
            check=False,
        )
    found = _COLLECTED.search(done.stderr)
    if done.returncode or found is None:
        raise SystemExit(done.stderr.decode(errors="replace")[-3000:])
    return int(found.group(1)), done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--against", action="append", default=[], metavar="TREE", help="another checkout")
    parser.add_argument("--shape", action="append", choices=["unary", "envoy"], help="default: both")
    parser.add_argument("--small", type=int, default=500, help="calls in the first run (default 500)")
    parser.add_argument("--large", type=int, default=3000, help="calls in the second (default 3000)")
    parser.add_argument("--json", action="store_true", help="one JSON line instead of text")
    parser.add_argument("--feed", metavar="READS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.feed:
        feed(args.feed)
        return
    trees = {"this": ROOT, **{str(tree): Path(tree).resolve() for tree in args.against}}
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for shape in args.shape or ["unary", "envoy"]:
            files = {}
            for calls in (args.small, args.large):
                files[calls] = f"{scratch}/{shape}-{calls}.pickle"
                with open(files[calls], "wb") as file:
                    pickle.dump(build_reads(shape, calls), file)
            written: dict[int, bytes] = {}
            for name, tree in trees.items():
                counts = {}
                for calls, path in files.items():
                    counts[calls], out = instructions(tree, path)
                    if written.setdefault(calls, out) != out:
                        raise SystemExit(
                            f"{name} wrote {out!r} bytes for {calls} {shape} calls, not {written[calls]!r}"
                        )
                per_call = (counts[args.large] - counts[args.small]) / (args.large - args.small)
                results.setdefault(name, {})[shape] = round(per_call)
                if not args.json:
                    print(f"{shape:>6} {name}: {per_call:,.0f} instructions per call", flush=True)
    if args.json:
        print(json.dumps(results))
    elif len(trees) > 1:
        base = results["this"]
        for name in list(trees)[1:]:
            for shape, value in results[name].items():
                print(f"{shape:>6} this vs {name}: {100 * (base[shape] / value - 1):+.2f}%")


if __name__ == "__main__":
    main()
