"""What the snapshot's hot paths cost, without sockets: the codec at 200 pods, ``normalize.on_page`` and
the picker's copy of a pod with another ``waiting``.

- ``encode_pool``: a 200-pod pool, every pod encoded;
- ``PoolEncoder.pool``: the same pool with half its pods new since the last call (as paced: a publish
  every 25 ms, a scrape of each pod every 50 ms);
- ``decode_pool``: that pool's blob, as the picker reads it;
- ``on_page``: one merge of a page's numbers into a loaded pod (with a LoRA state, then without);
- ``replace_waiting``: a copy of a pod with another ``waiting`` (the picker makes one per decision).

Each is the best of many short repeats (µs per unit, CPU time). To compare with the code before a
change, run it on that code too, in the same minutes, a few times each way:

    mkdir -p /tmp/before && git archive HEAD shared services/collector | tar -x -C /tmp/before
    B=/tmp/before; PYTHONPATH=$B/shared/src:$B/services/collector/src .venv/bin/python bench/snapshot_paths.py
    .venv/bin/python bench/snapshot_paths.py
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import time
from collections.abc import Callable

from pointsman_collector import normalize
from pointsman_shared import codec
from pointsman_shared.model_server import LoraState, PageMetrics
from pointsman_shared.snapshot import FieldTimes, PodSnapshot, PoolSnapshot, replace_waiting

PODS = 200
NOW = 1_764_000_100.0


def pool() -> PoolSnapshot:
    pods = tuple(
        PodSnapshot(
            address=f"10.0.{i // 250}.{i % 250}:8000",
            waiting=i % 7,
            running=i % 13,
            kv_cache_usage=(i % 100) / 100,
            max_lora=4,
            running_adapters=frozenset({f"adapter-{i % 5}", f"adapter-{i % 3}"}),
            waiting_adapters=frozenset({f"adapter-{i % 11}"} if i % 2 else ()),
            updated_at=NOW - i / 1000,
            field_times=FieldTimes(NOW, NOW, NOW - 0.05, NOW - 1.0),
        )
        for i in range(PODS)
    )
    return PoolSnapshot("bench-pool", 1, NOW, pods)


def cases() -> dict[str, tuple[Callable[[], None], int]]:
    whole = pool()
    blob = codec.encode_pool(whole)
    encoder = codec.PoolEncoder()
    # Two pools that differ in every other pod: each call finds half its pods new.
    halves = [
        dataclasses.replace(
            whole,
            pods=tuple(p if i % 2 else dataclasses.replace(p, waiting=k) for i, p in enumerate(whole.pods)),
        )
        for k in (1, 2)
    ]
    loaded = normalize.PodState(whole.pods[1], good=True)
    with_lora = PageMetrics(3, 5, 0.42, LoraState(4, frozenset({"a", "b"}), frozenset({"c"})))
    without_lora = PageMetrics(3, 5, 0.42, None)
    on_page = normalize.on_page
    pod = whole.pods[1]
    n = 2_000

    def encode() -> None:
        for _ in range(20):
            codec.encode_pool(whole)

    def encode_half() -> None:
        for i in range(20):
            encoder.pool(halves[i % 2])

    def decode() -> None:
        for _ in range(20):
            codec.decode_pool(blob, 1)

    def page_lora() -> None:
        for _ in range(n):
            on_page(loaded, with_lora, NOW)

    def page_plain() -> None:
        for _ in range(n):
            on_page(loaded, without_lora, NOW)

    def copy() -> None:
        for i in range(n):
            replace_waiting(pod, i)

    return {
        "encode_pool_200_us": (encode, 20),
        "pool_encoder_half_new_200_us": (encode_half, 20),
        "decode_pool_200_us": (decode, 20),
        "on_page_lora_us": (page_lora, n),
        "on_page_no_lora_us": (page_plain, n),
        "replace_waiting_us": (copy, n),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    timed = cases()
    gc.disable()  # a collection inside one repeat would be noise, not the code's cost
    best = dict.fromkeys(timed, float("inf"))
    for run, _ in timed.values():
        run()  # warm-up
    for _ in range(args.repeats):
        for name, (run, units) in timed.items():
            began = time.process_time()
            run()
            best[name] = min(best[name], (time.process_time() - began) / units * 1e6)
    print(json.dumps({name: round(us, 2) for name, us in best.items()}, indent=2))


if __name__ == "__main__":
    main()
