"""The response-side metrics, under upstream's names and labels."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from pointsman_picker.extproc.stream import Completion
from pointsman_picker.extproc.usage import Usage
from pointsman_picker.metrics import PickerMetrics

LABELS = {"model_name": "m", "target_model_name": "t"}


USAGE = Usage(7, 3)


def done(status: int = 200, usage: Usage | None = USAGE) -> Completion:
    return Completion("m", "t", status, 1.5, 100, 300, usage)


@pytest.mark.parametrize(
    ("completion", "errors", "tokens"),
    [(done(), None, 1.0), (done(usage=None), None, None), (done(status=500, usage=None), 1.0, None)],
)
def test_a_completed_response_is_observed(completion, errors, tokens):
    registry = CollectorRegistry()
    PickerMetrics(registry).completed(completion)
    value = registry.get_sample_value
    assert value("inference_model_request_duration_seconds_sum", LABELS) == 1.5
    assert value("inference_model_request_sizes_sum", LABELS) == 100
    assert value("inference_model_response_sizes_sum", LABELS) == 300
    assert value("inference_model_input_tokens_count", LABELS) == tokens
    assert value("inference_model_output_tokens_count", LABELS) == tokens
    assert value("inference_model_request_error_total", LABELS | {"error_code": "ModelServer500"}) == errors


def test_tokens_are_observed_as_counts():
    registry = CollectorRegistry()
    PickerMetrics(registry).completed(done())
    assert registry.get_sample_value("inference_model_input_tokens_sum", LABELS) == 7
    assert registry.get_sample_value("inference_model_output_tokens_sum", LABELS) == 3
