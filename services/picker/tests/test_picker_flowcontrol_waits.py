"""Each pod's expected wait from dispatch to response headers: measured, smoothed with a margin for
spread, the pool's for a pod not seen yet, the default before anything is seen."""

from __future__ import annotations

import pytest

from pointsman_picker.flowcontrol.waits import PodWaits

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"


def waits(*observed: tuple[str, float], default: float = 0.5, max_pods: int = 16) -> PodWaits:
    w = PodWaits(default, max_pods=max_pods)
    for address, seconds in observed:
        w.observe(address, seconds)
    return w


@pytest.mark.parametrize(
    ("observed", "address", "expected"),
    [
        pytest.param((), A, 0.5, id="nothing seen: the default"),
        # One observation R: mean R, deviation R/2, expected R + 2 * R/2.
        pytest.param(((A, 0.3),), A, 0.6, id="first observation: twice it"),
        pytest.param(((B, 0.3),), A, 0.6, id="a pod not seen: the pool's"),
        pytest.param(((A, 0.3), (B, 0.1)), A, 0.6, id="a pod seen: its own, not the pool's"),
        pytest.param(((A, -1.0),), A, 0.0, id="a negative wait (clock step) counts as none"),
    ],
)
def test_expected(observed, address, expected):
    assert waits(*observed).expected(address) == pytest.approx(expected)


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


def test_past_max_pods_the_one_observed_longest_ago_goes():
    w = waits((B, 0.1), (A, 1.0), (C, 0.1), max_pods=2)
    assert w.expected(B) == w.expected("10.0.0.9:8000") != pytest.approx(0.2)  # gone: the pool's
    assert w.expected(A) == pytest.approx(2.0)
    assert w.expected(C) == pytest.approx(0.2)
