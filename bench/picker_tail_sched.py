"""Where the time of ``bench/picker_tail.py``'s runs went on the CPUs: the wait of each measured process
for a CPU after every wakeup, and what ran meanwhile when the picker waited long.

Record the whole harness run with the scheduler's tracepoints on the monotonic clock the harness uses,
then read both::

    perf sched record -k CLOCK_MONOTONIC -o sched.data -- sleep 75 &
    .venv/bin/python bench/picker_tail.py --setups alone,shipped --output tail.json
    perf sched timehist -i sched.data > sched.txt
    .venv/bin/python bench/picker_tail_sched.py tail.json sched.txt

Per run and process: wakeups (switches in), their scheduling delay (runnable until running) at the
median and p99, the longest, and how many waited more than 1 ms; for the picker's waits longer than
``--long`` ms, the CPU time of whatever ran on the CPUs meanwhile, by process (other people's work
shows under its own name).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import NamedTuple

from pointsman_shared.stats import percentile

_ROW = re.compile(r"\s*([\d.]+)\s+\[(\d+)\]\s+(.+?)\[(\d+)(?:/(\d+))?\]\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")


class Switch(NamedTuple):
    """One ``perf sched timehist`` line: a task switched out at ``at`` after running ``ran`` ms,
    having waited ``delay`` ms for the CPU after its wakeup."""

    at: float
    name: str
    pid: int
    delay: float
    ran: float


def read_timehist(path: Path) -> list[Switch]:
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        m = _ROW.match(line)
        if m:
            pid = int(m[5]) if m[5] else int(m[4])
            rows.append(Switch(float(m[1]), m[3].strip(), pid, float(m[7]), float(m[8])))
    return rows


def summary(run: dict, seconds: float, rows: list[Switch], long_ms: float) -> dict:
    began, ended = run["began"], run["began"] + seconds
    names = {pid: name for name, pid in run["pids"].items()}
    inside = [r for r in rows if began <= r.at <= ended]
    delays: dict[str, list[float]] = defaultdict(list)
    for r in inside:
        if r.pid in names:
            delays[names[r.pid]].append(r.delay)
    processes = {
        name: {
            "wakeups": len(d),
            "delay_p50_ms": round(percentile(d, 0.5), 3),
            "delay_p99_ms": round(percentile(d, 0.99), 3),
            "delay_max_ms": round(max(d), 3),
            "over_1ms": sum(1 for x in d if x > 1),
        }
        for name, d in delays.items()
    }
    meanwhile: Counter[str] = Counter()
    long_waits = 0
    for r in inside:
        if names.get(r.pid) != "picker" or r.delay < long_ms:
            continue
        long_waits += 1
        start = r.at - r.ran / 1e3
        woke = start - r.delay / 1e3
        for other in inside:
            other_start = other.at - other.ran / 1e3
            if other.at > woke and other_start < start:
                overlap = min(other.at, start) - max(other_start, woke)
                meanwhile[names.get(other.pid, other.name)] += overlap * 1e3
    return {
        "p99_ms": run["p99_ms"],
        "processes": processes,
        "picker_long_waits": long_waits,
        "ran_meanwhile_ms": {k: round(v, 1) for k, v in meanwhile.most_common(6)},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tail", type=Path, help="bench/picker_tail.py's JSON")
    parser.add_argument("timehist", type=Path, help="perf sched timehist's output over the same minutes")
    parser.add_argument("--long", type=float, default=2.0, help="a picker wait this long (ms) is looked into")
    args = parser.parse_args()
    tail = json.loads(args.tail.read_text())
    seconds = float(tail["args"]["seconds"])
    rows = read_timehist(args.timehist)
    out = [
        {setup: summary(run, seconds, rows, args.long) for setup, run in one.items()}
        for one in tail["rounds"]
    ]
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
