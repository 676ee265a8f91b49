from __future__ import annotations

import dataclasses

import pytest

from pointsman_shared.snapshot import PodSnapshot, is_fresh, replace_waiting, replacer
from pointsman_testkit import every_field_set


def slots(obj: object) -> list[object]:
    """Every slot's value, the fields left out of == (active_adapters) too."""
    return [getattr(obj, name) for name in type(obj).__slots__]  # type: ignore[attr-defined]


INIT_FIELDS = [f.name for f in dataclasses.fields(PodSnapshot) if f.init]


def test_every_field_set_leaves_no_field_at_its_default() -> None:
    pod = every_field_set()
    for f in dataclasses.fields(PodSnapshot):
        if f.init and f.default is not dataclasses.MISSING:
            assert getattr(pod, f.name) != f.default, f.name


def test_active_adapters_is_the_union() -> None:
    pod = PodSnapshot("a:1", running_adapters=frozenset({"x"}), waiting_adapters=frozenset({"y", "x"}))
    assert pod.active_adapters == {"x", "y"}


@pytest.mark.parametrize(
    ("updated_at", "now", "fresh"), [(10.0, 12.0, True), (10.0, 12.01, False), (10, 9, True)]
)
def test_is_fresh(updated_at: float, now: float, fresh: bool) -> None:
    assert is_fresh(PodSnapshot("a:1", updated_at=updated_at), now, max_age=2.0) is fresh


def test_replace_waiting_carries_every_other_field() -> None:
    pod = every_field_set()
    copy = replace_waiting(pod, 99)
    assert type(copy) is PodSnapshot
    assert slots(copy) == slots(dataclasses.replace(pod, waiting=99))


@pytest.mark.parametrize("name", INIT_FIELDS)
def test_a_replacer_is_dataclasses_replace(name: str) -> None:
    before, other = PodSnapshot("a:1", running_adapters=frozenset({"r"})), every_field_set()
    value = getattr(other, name)
    got, want = replacer(name)(before, value), dataclasses.replace(before, **{name: value})
    assert slots(got) == slots(want)
    assert hash(got) == hash(want)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.waiting = 9  # type: ignore[misc]


def test_a_replacer_of_several_fields_works_the_adapter_union_out_again() -> None:
    before = PodSnapshot("a:1", running_adapters=frozenset({"r"}), waiting_adapters=frozenset({"w"}))
    got = replacer("waiting_adapters", "waiting")(before, frozenset({"x"}), 3)
    assert (got.waiting, got.active_adapters) == (3, {"r", "x"})


@pytest.mark.parametrize(
    "names",
    [(), ("nope",), ("waiting", "waiting"), ("active_adapters",)],
    ids=["none", "unknown", "twice", "derived"],
)
def test_a_replacer_takes_distinct_fields_that_are_arguments(names: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="distinct PodSnapshot fields"):
        replacer(*names)
