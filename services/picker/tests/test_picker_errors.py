"""The error tree and its one mapping to an ImmediateResponse."""

from __future__ import annotations

import orjson
import pytest

from pointsman_picker import errors
from pointsman_picker.extproc.request import parse_body


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (errors.BadRequest("bad"), 400, "BadRequest"),
        (errors.UnknownModel("who"), 404, "BadConfiguration"),
        (errors.BodyTooLarge("big"), 413, "RequestTooLarge"),
        (errors.NoCapacity("full"), 429, "InferencePoolResourceExhausted"),
        (errors.Internal("oops"), 500, "Internal"),
        (errors.NoEndpoints("none"), 503, "ServiceUnavailable"),
    ],
)
def test_error_response(error, status, code):
    response = errors.error_response(error)
    assert response.WhichOneof("response") == "immediate_response"
    assert response.immediate_response.status.code == status
    assert orjson.loads(response.immediate_response.body) == {
        "error": {"code": status, "message": error.message}
    }
    assert error.code == code


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[1]", "not a JSON object"),
        (b"null", "model not found"),
        (b'{"prompt": "x"}', "model not found"),
        (b'{"model": null}', "model not found"),
        (b'{"model": 3}', "not a string"),
        (b'{"model": ["m"]}', "not a string"),
    ],
)
def test_bad_bodies_are_400(raw, message):
    with pytest.raises(errors.BadRequest, match=message):
        parse_body(raw)
