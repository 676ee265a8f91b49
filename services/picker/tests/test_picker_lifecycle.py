"""A profile's request lifecycle: producers before consumers, only overridden hooks run, what cannot
be ordered is refused; and a reload keeps the plugins whose spec did not change."""

from __future__ import annotations

import random
import time
from typing import ClassVar

import pytest
from picker_builders import NOW, config, ctx, pod, snapshot
from prometheus_client import CollectorRegistry

from pointsman_picker.director import Director
from pointsman_picker.metrics import PickerMetrics
from pointsman_picker.scheduling import CycleState, DataKey, Pods, RequestPlugin, SchedulingRequest, Ticket
from pointsman_picker.scheduling.lifecycle import Lifecycle, LifecycleError, order
from pointsman_picker.snapshots import StaticSnapshotSource

A: DataKey[int] = DataKey("a")
B: DataKey[int] = DataKey("b")
C: DataKey[int] = DataKey("c")


def plugin(name: str, produces=(), consumes=(), log: list[str] | None = None) -> RequestPlugin:
    """A request plugin that writes 1 + the sum of what it consumes into what it produces."""

    class Made(RequestPlugin):
        type_name: ClassVar[str] = name

        def prepare(self, request: SchedulingRequest, pods: Pods, state: CycleState, now: float) -> Pods:
            if log is not None:
                log.append(f"prepare {name}")
            value = 1 + sum(state[key] for key in consumes)
            for key in produces:
                state[key] = value
            return pods

    Made.produces, Made.consumes = tuple(produces), tuple(consumes)
    return Made()


def types(plugins: list[RequestPlugin]) -> list[str]:
    return [p.type_name for p in plugins]


def nothing(key: DataKey[int]) -> RequestPlugin | None:
    return None


@pytest.mark.parametrize(
    ("name", "given", "wanted", "makes", "expected"),
    [
        ("already in order", ["pa", "pb"], (B,), {}, ["pa", "pb"]),
        ("producer moved before its consumer", ["pb", "pa"], (B,), {}, ["pa", "pb"]),
        ("a missing producer is made", ["pb"], (B,), {A: "pa"}, ["pa", "pb"]),
        ("what the profile wants is made", [], (A,), {A: "pa"}, ["pa"]),
        ("made producers bring theirs", [], (B,), {A: "pa", B: "pb"}, ["pa", "pb"]),
    ],
)
def test_order(name, given, wanted, makes, expected):
    library = {
        "pa": lambda: plugin("pa", produces=[A]),
        "pb": lambda: plugin("pb", produces=[B], consumes=[A]),
    }
    ordered = order(
        [library[n]() for n in given],
        wanted,
        lambda key: library[makes[key]]() if key in makes else None,
    )
    assert types(ordered) == expected, name


@pytest.mark.parametrize(
    ("name", "plugins", "wanted", "message"),
    [
        ("nobody produces it", [plugin("x", consumes=[A])], (), "nothing produces 'a'"),
        ("nobody produces what the profile wants", [], (C,), "nothing produces 'c'"),
        ("two producers", [plugin("x", produces=[A]), plugin("y", produces=[A])], (), "produced by both"),
        (
            "a cycle",
            [plugin("x", produces=[A], consumes=[B]), plugin("y", produces=[B], consumes=[A])],
            (),
            "cycle",
        ),
    ],
)
def test_what_cannot_be_ordered_is_refused(name, plugins, wanted, message):
    with pytest.raises(LifecycleError, match=message):
        order(plugins, wanted, nothing)


def test_a_plugin_may_read_what_it_wrote_and_the_directors_keys_are_given():
    own = plugin("own", produces=[A], consumes=[A, C])
    assert types(order([own], (A,), nothing, given=(C,))) == ["own"]


def test_hooks_run_in_order_and_only_where_overridden():
    log: list[str] = []

    class Watcher(RequestPlugin):
        type_name: ClassVar[str] = "watcher"
        consumes = (B,)

        def picked(self, ticket: Ticket, request: SchedulingRequest, state: CycleState) -> None:
            log.append(f"picked {ticket.address} b={state[B]}")

        def finished(self, ticket: Ticket) -> None:
            log.append(f"finished {ticket.key}")

        def note(self, state: CycleState) -> str:
            return f"b={state[B]}"

    plugins = order(
        [Watcher(), plugin("pb", produces=[B], consumes=[A], log=log), plugin("pa", produces=[A], log=log)],
        (),
        nothing,
    )
    lifecycle = Lifecycle(plugins)
    state = CycleState()
    pods = (pod(address="a"),)
    request = SchedulingRequest("m", critical=True)
    assert lifecycle.prepare(request, pods, state, NOW) is pods
    lifecycle.picked(Ticket(7, "a", NOW), request, state)
    lifecycle.finished(Ticket(7, "a", NOW))
    assert log == ["prepare pa", "prepare pb", "picked a b=2", "finished 7"]
    assert lifecycle.notes(state) == ["b=2"]
    assert [hook.__self__.type_name for hook in lifecycle._prepare] == ["pa", "pb"]  # not the watcher's
    assert [hook.__self__.type_name for hook in lifecycle._finished] == ["watcher"]


# -- across a reload ----------------------------------------------------------------------------------
BEST_LIKE = {
    "plugins": [
        {"name": "w", "type": "least-work-filter"},
        {"name": "s", "type": "lora-spread-affinity-filter"},
    ],
    "profiles": [{"name": "p", "plugins": [{"pluginRef": "s"}, {"pluginRef": "w"}]}],
}


def director(**picker) -> Director:
    return Director(
        config(**BEST_LIKE, picker={"profile": "p", **picker}),
        StaticSnapshotSource(snapshot(pod(address="a", max_lora=2), pod(address="b", max_lora=2))),
        PickerMetrics(CollectorRegistry()),
        rng=random.Random(1),
        clock=lambda: NOW,
        timer=time.perf_counter,
    )


def by_type(d: Director) -> dict[str, RequestPlugin]:
    return {p.type_name: p for p in d._lifecycle.plugins}


def test_a_reload_keeps_the_plugins_whose_spec_did_not_change():
    d = director()
    before = by_type(d)
    assert set(before) == {"recent-assignments", "prefill-backlog", "recent-targets", "adapter-slots"}
    routing = d.route(ctx(b'{"model":"plain","prompt":"xxxx"}'))
    d.reconfigure(config(**BEST_LIKE, picker={"profile": "p", "prefillTokensPerSecond": 1000}))
    after = by_type(d)
    assert after["recent-assignments"] is before["recent-assignments"]  # in flight: still counted
    assert after["recent-targets"] is before["recent-targets"]
    assert after["adapter-slots"] is before["adapter-slots"]
    assert after["prefill-backlog"] is not before["prefill-backlog"]  # its rate changed
    assert any(after["recent-assignments"]._times.values())  # the routed request, still in flight
    d.release(routing)
    assert not any(after["recent-assignments"]._times.values())  # released by its ticket
    d.reconfigure(config(**BEST_LIKE, picker={"profile": "p", "countAssignments": False}))
    assert set(by_type(d)) == {"prefill-backlog", "recent-targets", "adapter-slots"}
    d.release(routing)  # a plugin gone with the reload: nothing to do
