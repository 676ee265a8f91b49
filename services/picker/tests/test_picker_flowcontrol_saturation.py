"""The saturation detector: upstream's per-pod queue and KV-cache thresholds (the pool saturated when
no pod has room), the pool-wide mean of running plus waiting requests, and each band's thresholds
falling back to the pool-wide ones, then to the scheduling profile's."""

from __future__ import annotations

import pytest
from picker_builders import pod

from pointsman_picker.flowcontrol.saturation import Thresholds, saturated, saturation
from pointsman_shared.config import FlowControlConfig, SchedulingConfig

A, B = "10.0.0.1:8000", "10.0.0.2:8000"


@pytest.mark.parametrize(
    ("pods", "thresholds", "extra", "expected"),
    [
        ((pod(1, address=A), pod(5, address=B)), Thresholds(5, 0.8), {}, False),  # A has room
        ((pod(5, address=A), pod(5, address=B)), Thresholds(5, 0.8), {}, True),
        ((pod(1, 0.9, address=A), pod(5, address=B)), Thresholds(5, 0.8), {}, True),  # A's KV cache
        ((pod(1, address=A), pod(5, address=B)), Thresholds(5, 0.8), {A: 4}, True),  # unseen assignments
        # the pool-wide mean of running + waiting: 95 is under 100; then 100, though A's queue has room
        ((pod(0, address=A), pod(0, running=190, address=B)), Thresholds(99, 1.0, 100), {}, False),
        ((pod(0, address=A), pod(5, running=190, address=B)), Thresholds(99, 1.0, 100), {A: 5}, True),
        ((), Thresholds(5, 0.8, 100), {}, True),  # no pod at all
    ],
)
def test_saturated(pods, thresholds, extra, expected):
    assert saturated(pods, thresholds, extra) is expected


def test_saturation_is_at_least_the_pools_mean_load():
    pods = (pod(0, address=A), pod(0, running=100, address=B))
    assert saturation(pods, Thresholds(10, 1.0), {}) == 0.0
    assert saturation(pods, Thresholds(10, 1.0, 100), {}) == 0.5


@pytest.mark.parametrize(
    ("flow", "priority", "expected"),
    [
        ({}, None, Thresholds(5, 0.8)),  # the scheduling thresholds
        ({"saturationDetector": {"maxPodRequests": 400}}, -1, Thresholds(5, 0.8, 400)),  # no band: the pool's
        (
            {
                "saturationDetector": {"queueDepthThreshold": 50, "maxPodRequests": 400},
                "priorityBands": [{"priority": 0, "saturationDetector": {"maxPodRequests": 800}}],
            },
            0,
            Thresholds(50, 0.8, 800),
        ),
        (
            {"priorityBands": [{"priority": 0, "saturationDetector": {"kvCacheUtilThreshold": 0.9}}]},
            0,
            Thresholds(5, 0.9),
        ),
    ],
)
def test_a_bands_thresholds_fall_back_to_the_pools_then_the_profiles(flow, priority, expected):
    config = FlowControlConfig.model_validate(flow)
    assert Thresholds.of(config, SchedulingConfig(), priority) == expected
