"""A probe for the picker's tail (bench/picker_tail.py --probe): imported at start-up when this folder is
on PYTHONPATH and TAIL_PROBE names an output file. It records, on the monotonic clock the client shares:
every cyclic-GC pass (generation, duration), the event loop's lateness (a 2 ms sleep woken late, and the
CPU the loop spent meanwhile), every read the HTTP/2 server handled that took longer than 0.3 ms (wall,
and the thread's CPU), each snapshot refresh and decode, each prefix-sync round, and each call of the
request path's main steps (stream handlers, the decision, metrics, stream open/close, HTTP/2 stream
ends) that took more than 0.2 ms of CPU; the process writes them as JSON when it exits. Not part of the
picker: an experiment's instrument (it costs the picker a wakeup every 2 ms)."""

import atexit
import gc
import json
import os
import time

OUT = os.environ.get("TAIL_PROBE")
if OUT:
    mono = time.monotonic
    cpu = time.thread_time
    events: dict[str, list] = {"gc": [], "lag": [], "read": [], "refresh": [], "decode": [], "sync": []}
    counts = {"reads": 0, "read_s": 0.0}
    _gc_start = [0.0, 0.0]

    def _gc(phase: str, info: dict) -> None:
        if phase == "start":
            _gc_start[:] = mono(), cpu()
        else:
            t, c = _gc_start
            gen, collected = info["generation"], info["collected"]
            events["gc"].append((t, gen, (mono() - t) * 1e3, collected, (cpu() - c) * 1e3))

    gc.callbacks.append(_gc)

    def _dump() -> None:
        with open(OUT, "w") as f:
            json.dump({"events": events, "counts": counts, "gc_threshold": gc.get_threshold()}, f)

    atexit.register(_dump)

    import asyncio

    from pointsman_shared import aio

    _run = aio.run

    async def _lag() -> None:
        while True:
            t, c = mono(), cpu()
            await asyncio.sleep(0.002)
            late = mono() - t - 0.002
            if late > 0.0015:  # and the CPU the loop spent meanwhile: busy, or not running at all
                events["lag"].append((t, late * 1e3, (cpu() - c) * 1e3))

    def run(main):  # type: ignore[no-untyped-def]
        async def wrapped():  # type: ignore[no-untyped-def]
            probe = asyncio.create_task(_lag())
            try:
                return await main
            finally:
                probe.cancel()

        return _run(wrapped())

    aio.run = run

    from pointsman_picker.h2grpc import connection

    _received = connection.H2Connection.data_received

    def data_received(self, data):  # type: ignore[no-untyped-def]
        t, c = mono(), cpu()
        _received(self, data)
        d = mono() - t
        counts["reads"] += 1
        counts["read_s"] += d
        if d > 0.0003:
            events["read"].append((t, d * 1e3, len(data), (cpu() - c) * 1e3))

    connection.H2Connection.data_received = data_received

    from pointsman_picker import snapshots

    _refresh = snapshots.RedisSnapshotSource.refresh
    _decode = snapshots.decode_pool

    async def refresh(self):  # type: ignore[no-untyped-def]
        t = mono()
        try:
            return await _refresh(self)
        finally:
            events["refresh"].append((t, (mono() - t) * 1e3))

    def decode_pool(blob, version):  # type: ignore[no-untyped-def]
        t = mono()
        try:
            return _decode(blob, version)
        finally:
            events["decode"].append((t, (mono() - t) * 1e3, len(blob)))

    snapshots.RedisSnapshotSource.refresh = refresh
    snapshots.decode_pool = decode_pool

    from pointsman_picker import prefix_sync

    _sync = prefix_sync.RedisPrefixSync.sync

    async def sync(self):  # type: ignore[no-untyped-def]
        t = mono()
        try:
            return await _sync(self)
        finally:
            events["sync"].append((t, (mono() - t) * 1e3))

    prefix_sync.RedisPrefixSync.sync = sync

    # The request path's main steps: each call that took more than 0.2 ms of CPU, by name.
    events["slow_calls"] = []

    def _timed(owner, name):  # type: ignore[no-untyped-def]
        inner = getattr(owner, name)
        label = f"{owner.__name__}.{name}"

        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            t, c = mono(), cpu()
            try:
                return inner(*args, **kwargs)
            finally:
                spent = cpu() - c
                if spent > 0.0002:
                    events["slow_calls"].append((t, label, spent * 1e3, (mono() - t) * 1e3))

        setattr(owner, name, timed)

    from pointsman_picker import director as _director
    from pointsman_picker import metrics as _metrics
    from pointsman_picker.extproc import servicer as _servicer
    from pointsman_picker.extproc import stream as _stream
    from pointsman_picker.h2grpc import protocol as _protocol

    for owner, names in (
        (
            _stream.RequestStream,
            ("_on_headers", "_on_body", "_on_response_headers", "response_chunk", "closed"),
        ),
        (_stream.RequestStream, ("_decide", "_routed", "_complete")),
        (_director.Director, ("route", "release")),
        (_metrics.PickerMetrics, ("completed", "finished")),
        (_servicer.ExtProcService, ("open", "close")),
        (_protocol.H2Protocol, ("_header_block_done", "_end", "_rst_stream", "_window_update", "_settings")),
    ):
        for name in names:
            _timed(owner, name)
