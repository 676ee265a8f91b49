"""CPU per page of reading what Pointsman needs from a vLLM metrics page: ``pointsman_shared.promparse``
(through ``model_server.read_page``, as a scrape reads it) against prometheus_client's text parser.

- ``ours_seen_lines``: ``read_page`` on a page whose lines it has seen before (a pod's page repeats most
  of its lines from one scrape to the next, and a line seen before is not checked again);
- ``ours_new_lines``: the same with the line cache emptied before every page, so every wanted line is
  checked (the worst case: every line of every page new);
- ``prometheus_client``: ``text_string_to_metric_families`` over the page decoded to text, every family
  parsed (it has no way to skip the ones not wanted), then the wanted families' samples picked out.

Each is the best of ``--repeats`` turns of ``--pages`` pages (CPU time), the three taking turns.

    .venv/bin/python bench/decisions/promparse.py [--page vllm-data-parallel] [--repeats 30]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from pointsman_shared import promparse
from pointsman_shared.model_server import PRESETS, read_page

PAGES = Path(__file__).resolve().parents[2] / "shared" / "tests" / "data" / "vllm-metrics"
NAMES = PRESETS["vllm"]


def cases(page: bytes) -> dict[str, Callable[[], object]]:
    wanted = set(NAMES.families)

    def ours_seen_lines() -> object:
        return read_page(page, NAMES)

    def ours_new_lines() -> object:
        promparse._seen_sample.cache_clear()
        return read_page(page, NAMES)

    def with_prometheus_client() -> object:
        return {
            family.name: family.samples
            for family in text_string_to_metric_families(page.decode())
            if family.name in wanted
        }

    return {
        "ours_seen_lines": ours_seen_lines,
        "ours_new_lines": ours_new_lines,
        "prometheus_client": with_prometheus_client,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--page", default="vllm-current-lora", help="a fixture page's name")
    parser.add_argument("--pages", type=int, default=50, help="pages per turn")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    page = (PAGES / f"{args.page}.txt").read_bytes()
    timed = cases(page)
    found = timed["prometheus_client"]()
    assert isinstance(found, dict)
    assert set(found) == {NAMES.waiting, NAMES.running, NAMES.kv_cache_usage[0], NAMES.lora_info}, found
    best = dict.fromkeys(timed, float("inf"))
    for run in timed.values():
        run()  # warm-up
    for _ in range(args.repeats):
        for name, run in timed.items():
            began = time.process_time()
            for _ in range(args.pages):
                run()
            best[name] = min(best[name], (time.process_time() - began) / args.pages * 1e6)
    result = {
        "page": args.page,
        "page_bytes": len(page),
        "prometheus_client": version("prometheus_client"),
        "us_per_page": {name: round(us, 1) for name, us in best.items()},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
