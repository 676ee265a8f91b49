"""CPU per scrape of ``normalize.on_page``, the merge of a page's numbers into a pod's state: through the
frozen dataclasses' constructors (what the collector does) against filling the same three objects
through their slots' own setters (what it did until 2026-12-01: a frozen ``__init__`` sets each field
through ``object.__setattr__``, a slot's setter costs about a third of that).

Also the picker's copy of a pod with another ``waiting`` (one per decision): the positional
constructor against ``snapshot.replace_waiting`` (straight-line slot setters made from the field list).

    .venv/bin/python bench/decisions/slot_setters.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from pointsman_collector.normalize import PodState, _max_lora, on_page
from pointsman_shared.model_server import LoraState, PageMetrics
from pointsman_shared.snapshot import FieldTimes, PodSnapshot, replace_waiting

NOW = 1_764_000_100.0
BEFORE = PodState(
    PodSnapshot(
        "10.0.0.1:8000",
        waiting=40,
        running=41,
        kv_cache_usage=0.99,
        max_lora=8,
        running_adapters=frozenset({"old-run"}),
        waiting_adapters=frozenset({"old-wait"}),
        updated_at=NOW - 0.05,
        field_times=FieldTimes(NOW - 0.05, NOW - 0.1, NOW - 0.2, NOW - 0.3),
    ),
    good=True,
)
PAGES = {
    "lora": PageMetrics(3, 5, 0.42, LoraState(4, frozenset({"a", "b"}), frozenset({"c"}))),
    "no_lora": PageMetrics(3, 5, 0.42, None),
}


def _setters(cls: type, *names: str) -> list[Callable[[object, object], None]]:
    return [cls.__dict__[name].__set__ for name in names]


_new = object.__new__
_t_waiting, _t_running, _t_kv, _t_lora = _setters(FieldTimes, "waiting", "running", "kv_cache_usage", "lora")
(
    _address,
    _waiting,
    _running,
    _kv,
    _max_lora_slot,
    _running_adapters,
    _waiting_adapters,
    _active_adapters,
) = _setters(
    PodSnapshot,
    *("address", "waiting", "running", "kv_cache_usage", "max_lora"),
    *("running_adapters", "waiting_adapters", "active_adapters"),
)
_updated_at, _healthy, _reason, _field_times = _setters(
    PodSnapshot, "updated_at", "healthy", "reason", "field_times"
)
_snapshot, _failures, _error, _good = _setters(PodState, "snapshot", "failures", "error", "good")


def on_page_by_slots(state: PodState, page: PageMetrics, now: float) -> PodState:
    """``on_page`` as it was: the same objects, filled slot by slot (the setters bound to names)."""
    prev, lora, times = state.snapshot, page.lora, state.snapshot.field_times
    new_times = _new(FieldTimes)
    _t_waiting(new_times, times.waiting if page.waiting is None else now)
    _t_running(new_times, times.running if page.running is None else now)
    _t_kv(new_times, times.kv_cache_usage if page.kv_cache_usage is None else now)
    _t_lora(new_times, now if lora is not None or page.idle_max_lora is not None else times.lora)
    snapshot = _new(PodSnapshot)
    _address(snapshot, prev.address)
    _waiting(snapshot, prev.waiting if page.waiting is None else page.waiting)
    _running(snapshot, prev.running if page.running is None else page.running)
    _kv(snapshot, prev.kv_cache_usage if page.kv_cache_usage is None else page.kv_cache_usage)
    _max_lora_slot(snapshot, _max_lora(prev.max_lora, page))
    if lora is None:
        _running_adapters(snapshot, prev.running_adapters)
        _waiting_adapters(snapshot, prev.waiting_adapters)
        _active_adapters(snapshot, prev.active_adapters)
    else:
        _running_adapters(snapshot, lora.running)
        _waiting_adapters(snapshot, lora.waiting)
        _active_adapters(snapshot, lora.running | lora.waiting if lora.waiting else lora.running)
    _updated_at(snapshot, now)
    _healthy(snapshot, True)
    _reason(snapshot, "")
    _field_times(snapshot, new_times)
    new = _new(PodState)
    _snapshot(new, snapshot)
    _failures(new, 0)
    _error(new, "")
    _good(new, True)
    return new


def constructor_copy(pod: PodSnapshot, waiting: int) -> PodSnapshot:
    return PodSnapshot(
        pod.address,
        waiting,
        pod.running,
        pod.kv_cache_usage,
        pod.max_lora,
        pod.running_adapters,
        pod.waiting_adapters,
        pod.updated_at,
        pod.healthy,
        pod.reason,
        pod.field_times,
    )


def slots(obj: object) -> list[object]:
    return [getattr(obj, name) for name in type(obj).__slots__]  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    n = 2_000
    timed: dict[str, Callable[[], object]] = {}
    for name, page in PAGES.items():
        a, b = on_page(BEFORE, page, NOW), on_page_by_slots(BEFORE, page, NOW)
        assert (a, slots(a.snapshot)) == (b, slots(b.snapshot)), name  # the same objects either way
        timed[f"on_page_{name}_constructors"] = lambda page=page: [
            on_page(BEFORE, page, NOW) for _ in range(n)
        ]
        timed[f"on_page_{name}_slot_setters"] = lambda page=page: [
            on_page_by_slots(BEFORE, page, NOW) for _ in range(n)
        ]
    pod = BEFORE.snapshot
    assert slots(constructor_copy(pod, 9)) == slots(replace_waiting(pod, 9))
    timed["copy_constructor"] = lambda: [constructor_copy(pod, i) for i in range(n)]
    timed["copy_replace_waiting"] = lambda: [replace_waiting(pod, i) for i in range(n)]
    best = dict.fromkeys(timed, float("inf"))
    for _ in range(args.repeats):
        for name, run in timed.items():  # turns, so all see the same moments of the machine
            began = time.process_time()
            run()
            best[name] = min(best[name], (time.process_time() - began) / n * 1e6)
    print(json.dumps({"us_per_call": {name: round(us, 2) for name, us in best.items()}}, indent=2))


if __name__ == "__main__":
    main()
