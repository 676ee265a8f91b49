"""What the picker reads from a request body, and the rewrite of its ``model``."""

from __future__ import annotations

import pytest

from pointsman_picker import errors
from pointsman_picker.body import parse_body, with_model

SPEC_BODY = b'{"max_tokens":100,"model":"my-model","prompt":"test1","temperature":0}'


def test_spec_example_70_bytes_becomes_76():
    assert len(SPEC_BODY) == 70
    out = with_model(parse_body(SPEC_BODY), "my-model-12345")
    assert out == b'{"max_tokens":100,"model":"my-model-12345","prompt":"test1","temperature":0}'
    assert len(out) == 76


def test_unchanged_model_forwards_the_original_bytes():
    raw = b'{ "model" : "m",  "z": 1.0, "a": "<>" }'
    assert with_model(parse_body(raw), "m") is raw


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
