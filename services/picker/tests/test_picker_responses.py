"""The ProcessingResponse builders."""

from __future__ import annotations

import orjson
import pytest
from envoy.config.core.v3 import base_pb2
from picker_builders import metadata, set_headers

from pointsman_picker import errors
from pointsman_picker.extproc import responses

DEST = "x-gateway-destination-endpoint"
ROUTE = {"destination_header": DEST, "metadata_namespace": "envoy.lb"}


def test_request_headers_continue_clears_the_route_cache():
    response = responses.request_headers_continue()
    assert response.WhichOneof("response") == "request_headers"
    assert response.request_headers.response.clear_route_cache
    assert not response.request_headers.response.header_mutation.set_headers
    assert not response.HasField("dynamic_metadata")


def test_request_body_routed_rewritten():
    response = responses.request_body_routed("10.0.0.2:8000", b'{"model":"t"}', rewritten=True, **ROUTE)
    assert set_headers(response) == {DEST: "10.0.0.2:8000", "Content-Length": "13"}
    assert response.request_body.response.body_mutation.body == b'{"model":"t"}'
    assert metadata(response) == {"envoy.lb": {DEST: "10.0.0.2:8000"}}
    assert all(
        h.append_action == base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
        for h in response.request_body.response.header_mutation.set_headers
    )


def test_request_body_routed_unchanged_has_no_body_mutation():
    response = responses.request_body_routed("10.0.0.2:8000", b"{}", rewritten=False, **ROUTE)
    assert not response.request_body.response.HasField("body_mutation")
    assert set_headers(response)["Content-Length"] == "2"


def test_names_come_from_the_caller():
    response = responses.request_body_routed(
        "h:1", b"", rewritten=False, destination_header="x-dest", metadata_namespace="ns"
    )
    assert set_headers(response)["x-dest"] == "h:1"
    assert metadata(response) == {"ns": {"x-dest": "h:1"}}


def test_request_headers_routed_for_a_request_without_body():
    response = responses.request_headers_routed("10.0.0.3:8000", **ROUTE)
    common = response.request_headers.response
    assert common.clear_route_cache
    assert set_headers(response, "request_headers") == {DEST: "10.0.0.3:8000"}
    assert metadata(response) == {"envoy.lb": {DEST: "10.0.0.3:8000"}}


def test_immediate():
    response = responses.immediate(429, b'{"x":1}', details="d")
    immediate = response.immediate_response
    assert immediate.status.code == 429
    assert immediate.body == b'{"x":1}'
    assert immediate.details == "d"
    assert {h.header.key: h.header.raw_value for h in immediate.headers.set_headers} == {
        "content-type": b"application/json"
    }


def test_empty_replies():
    assert responses.response_headers_continue().WhichOneof("response") == "response_headers"
    assert responses.response_body_continue().WhichOneof("response") == "response_body"
    assert responses.response_trailers_continue().WhichOneof("response") == "response_trailers"
    assert responses.request_trailers_continue().WhichOneof("response") == "request_trailers"
    assert responses.request_body_continue().WhichOneof("response") == "request_body"


@pytest.mark.parametrize(
    "error",
    [
        errors.BadRequest("bad"),
        errors.UnknownModel("who"),
        errors.BodyTooLarge("big"),
        errors.NoCapacity("full"),
        errors.Internal("oops"),
        errors.NoEndpoints("none"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_error_response_is_an_immediate_json_answer_with_the_error_s_status(error):
    response = responses.error_response(error)
    assert response.WhichOneof("response") == "immediate_response"
    assert response.immediate_response.status.code == error.status
    assert response.immediate_response.details == f"pointsman_{error.result}"
    assert orjson.loads(response.immediate_response.body) == {
        "error": {"code": error.status, "message": error.message}
    }


def test_error_response_carries_the_path_in_the_explain_header_when_asked():
    error = errors.NoCapacity("full", explain="critical request -> dropped")
    names = {h.header.key for h in responses.error_response(error).immediate_response.headers.set_headers}
    assert "x-explain" not in names
    answered = responses.error_response(error, "x-explain").immediate_response.headers.set_headers
    assert {h.header.key: h.header.raw_value.decode() or h.header.value for h in answered}["x-explain"] == (
        "critical request -> dropped"
    )
