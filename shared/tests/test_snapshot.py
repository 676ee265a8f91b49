from __future__ import annotations

import pytest

from pointsman_shared.snapshot import PodSnapshot, is_fresh


def test_active_adapters_is_the_union() -> None:
    pod = PodSnapshot("a:1", running_adapters=frozenset({"x"}), waiting_adapters=frozenset({"y", "x"}))
    assert pod.active_adapters == {"x", "y"}


@pytest.mark.parametrize(
    ("updated_at", "now", "fresh"), [(10.0, 12.0, True), (10.0, 12.01, False), (10, 9, True)]
)
def test_is_fresh(updated_at: float, now: float, fresh: bool) -> None:
    assert is_fresh(PodSnapshot("a:1", updated_at=updated_at), now, max_age=2.0) is fresh
