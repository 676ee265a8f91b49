"""Live against virtual: ratios, and the tolerance on the required ones."""

from __future__ import annotations

import pytest
from quality_builders import stats

from pointsman_quality.agreement import agreement


def test_agreement_is_live_over_virtual_and_needs_both_ttft_percentiles_within_the_tolerance() -> None:
    virtual = stats(ttft_p50_s=0.5, ttft_p90_s=2.0)
    close = agreement({**virtual.as_dict(), "ttft_p50_s": 0.59, "ttft_p90_s": 1.62}, virtual)
    assert close["ratios"]["ttft_p50_s"] == pytest.approx(1.18)
    assert close["ratios"]["ttft_p90_s"] == pytest.approx(0.81)
    assert close["agrees"]
    far = agreement({**virtual.as_dict(), "ttft_p50_s": 0.5, "ttft_p90_s": 2.5}, virtual)
    assert not far["agrees"]  # p90 is 25% off
    zero = agreement(virtual.as_dict(), stats(ttft_p50_s=0.0))
    assert zero["ratios"]["ttft_p50_s"] is None
    assert not zero["agrees"]
