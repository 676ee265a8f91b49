"""The error tree: each error's HTTP status, upstream error code and result label."""

from __future__ import annotations

import pytest

from pointsman_picker import errors


@pytest.mark.parametrize(
    ("error", "status", "code", "result"),
    [
        (errors.BadRequest("bad"), 400, "BadRequest", "bad_request"),
        (errors.UnknownModel("who"), 404, "BadConfiguration", "unknown_model"),
        (errors.BodyTooLarge("big"), 413, "RequestTooLarge", "body_too_large"),
        (errors.NoCapacity("full"), 429, "InferencePoolResourceExhausted", "no_capacity"),
        (errors.Internal("oops"), 500, "Internal", "internal"),
        (errors.NoEndpoints("none"), 503, "ServiceUnavailable", "no_endpoints"),
    ],
)
def test_each_error_s_status_code_and_result(error, status, code, result):
    assert (error.status, error.code, error.result) == (status, code, result)
    assert isinstance(error, errors.PickerError)
