"""Each pod's expected wait from dispatch to response headers: measured per pod and target, smoothed
with a margin for spread; the pod's for a target it has not answered, the pool's for a pod not seen
yet, the default before anything is seen."""

from __future__ import annotations

from typing import Any

import pytest

from pointsman_picker.flowcontrol.waits import PodWaits

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"


def waits(*observed: tuple[Any, ...], default: float = 0.5, max_keys: int = 16) -> PodWaits:
    """Observations ``(address, seconds[, target[, slotted]])``."""
    w = PodWaits(default, deviations=2.0, max_keys=max_keys)
    for address, seconds, *rest in observed:
        w.observe(address, seconds, *rest)
    return w


# A pod's observations, for two targets: 0.4 s then 0.1 s: mean 0.3625, deviation 0.225.
TWO_TARGETS = ((A, 0.4, "x"), (A, 0.1, "y"))
# One target, sent while the pod ran it (0.1 s) and while it did not (0.4 s).
SLOTTED = ((A, 0.4, "x", False), (A, 0.1, "x", True))


@pytest.mark.parametrize(
    ("observed", "address", "key", "expected"),
    [
        pytest.param((), A, "", 0.5, id="nothing seen: the default"),
        # One observation R: mean R, deviation R/2, expected R + 2 * R/2.
        pytest.param(((A, 0.3),), A, "", 0.6, id="first observation: twice it"),
        pytest.param(((B, 0.3),), A, "", 0.6, id="a pod not seen: the pool's"),
        pytest.param(((A, 0.3), (B, 0.1)), A, "", 0.6, id="a pod seen: its own, not the pool's"),
        pytest.param(((A, -1.0),), A, "", 0.0, id="a negative wait (clock step) counts as none"),
        pytest.param(TWO_TARGETS, A, "x", 0.8, id="a target the pod answered: its own"),
        pytest.param(TWO_TARGETS, A, "y", 0.2, id="another target: its own"),
        pytest.param(TWO_TARGETS, A, "z", 0.3625 + 2 * 0.225, id="a target not answered: the pod's"),
        pytest.param(SLOTTED, A, ("x", True), 0.2, id="the target in a slot: its own"),
        pytest.param(SLOTTED, A, ("x", False), 0.8, id="the target waiting for a slot: its own"),
    ],
)
def test_expected(observed, address, key, expected):
    key = key if isinstance(key, tuple) else (key,)
    assert waits(*observed).expected(address, *key) == pytest.approx(expected)


def test_steady_waits_converge_on_their_value():
    w = waits(*[(A, 0.2)] * 60)
    assert w.expected(A) == pytest.approx(0.2, abs=0.001)


def test_spread_waits_are_expected_longer_than_their_mean():
    w = waits(*[(A, s) for s in (0.1, 0.5) * 40])
    assert 0.3 + 0.2 < w.expected(A) < 0.3 + 2 * 0.2 + 0.05  # past the mean by about two deviations


def test_a_slower_pod_moves_its_estimate_and_the_pools_but_not_another_pods():
    w = waits(*[(A, 0.2)] * 40, *[(B, 0.2)] * 40)
    for _ in range(20):
        w.observe(B, 2.0)
    assert w.expected(B) > 1.5
    assert w.expected(A) == pytest.approx(0.2, abs=0.01)
    assert 0.2 < w.expected(C) < w.expected(B)  # the pool's: between the two


def test_past_max_keys_the_one_observed_longest_ago_goes():
    w = waits((B, 0.1), (A, 1.0), (C, 0.1), max_keys=2)
    assert w.expected(B) == w.expected("10.0.0.9:8000") != pytest.approx(0.2)  # gone: the pool's
    assert w.expected(A) == pytest.approx(2.0)
    assert w.expected(C) == pytest.approx(0.2)
