"""The per-stream state machine, with a fake router (no gRPC, no snapshot)."""

from __future__ import annotations

import logging

import pytest
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from picker_builders import body, headers, post_headers, set_headers

from pointsman_picker import errors
from pointsman_picker.director import Routing
from pointsman_picker.extproc.stream import Phase, RequestStream, StreamSettings

SETTINGS = StreamSettings(max_body_bytes=10, destination_header="x-dest", metadata_namespace="envoy.lb")


class FakeRouter:
    def __init__(self, fail: Exception | None = None) -> None:
        self.bodies: list[bytes | None] = []
        self.errors: list[errors.PickerError] = []
        self.fail = fail

    def route(self, data: bytes | None) -> Routing:
        self.bodies.append(data)
        if self.fail is not None:
            raise self.fail
        return Routing("10.0.0.9:8000", data, rewritten=False)

    def stream(self, settings: StreamSettings = SETTINGS) -> RequestStream:
        return RequestStream(self.route, settings, on_error=self.errors.append)


def kinds(answers: list[pb.ProcessingResponse]) -> list[str]:
    return [a.WhichOneof("response") for a in answers]


def test_headers_then_body():
    router = FakeRouter()
    stream = router.stream()
    assert kinds(stream.handle(post_headers())) == ["request_headers"]
    assert stream.phase is Phase.BODY
    [answer] = stream.handle(body(b"{}"))
    assert set_headers(answer)["x-dest"] == "10.0.0.9:8000"
    assert router.bodies == [b"{}"]
    assert stream.phase is Phase.ROUTED


def test_chunks_accumulate_until_end_of_stream():
    router = FakeRouter()
    stream = router.stream()
    stream.handle(post_headers())
    assert stream.handle(body(b"ab", end_of_stream=False)) == []
    assert stream.handle(body(b"cd", end_of_stream=False)) == []
    assert kinds(stream.handle(body(b"ef"))) == ["request_body"]
    assert router.bodies == [b"abcdef"]


def test_a_buffered_body_is_one_message_even_without_end_of_stream():
    router = FakeRouter()
    stream = router.stream()
    first = post_headers()
    first.protocol_config.request_body_mode = processing_mode_pb2.ProcessingMode.BUFFERED
    stream.handle(first)
    assert kinds(stream.handle(body(b"{}", end_of_stream=False))) == ["request_body"]
    assert router.bodies == [b"{}"]


def test_trailers_end_the_body():
    router = FakeRouter()
    stream = router.stream()
    stream.handle(post_headers())
    stream.handle(body(b"{}", end_of_stream=False))
    trailers = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())
    assert kinds(stream.handle(trailers)) == ["request_body", "request_trailers"]
    assert router.bodies == [b"{}"]


@pytest.mark.parametrize("chunks", [[b"x" * 11], [b"x" * 6, b"x" * 5]])
def test_body_over_the_cap_is_413(chunks):
    router = FakeRouter()
    stream = router.stream()
    stream.handle(post_headers())
    answers = []
    for chunk in chunks:
        answers += stream.handle(body(chunk, end_of_stream=False))
    assert [a.immediate_response.status.code for a in answers] == [413]
    assert stream.phase is Phase.FAILED
    assert router.bodies == []
    assert [e.status for e in router.errors] == [413]
    assert stream.handle(body(b"more")) == []


def test_body_at_the_cap_is_fine():
    router = FakeRouter()
    stream = router.stream()
    stream.handle(post_headers())
    assert kinds(stream.handle(body(b"x" * 10))) == ["request_body"]


def test_headers_with_end_of_stream_route_without_a_body():
    router = FakeRouter()
    stream = router.stream()
    [answer] = stream.handle(headers((":method", "GET"), end_of_stream=True))
    assert answer.request_headers.response.clear_route_cache
    assert set_headers(answer, "request_headers") == {"x-dest": "10.0.0.9:8000"}
    assert router.bodies == [None]


@pytest.mark.parametrize(
    ("fail", "status"),
    [(errors.NoCapacity("full"), 429), (errors.UnknownModel("who"), 404), (KeyError("bug"), 500)],
)
def test_routing_errors_become_immediate_responses(fail, status):
    router = FakeRouter(fail)
    stream = router.stream()
    stream.handle(post_headers())
    [answer] = stream.handle(body(b"{}"))
    assert answer.immediate_response.status.code == status
    assert [e.status for e in router.errors] == [status]


def test_response_phase_gets_empty_replies():
    stream = FakeRouter().stream()
    stream.handle(post_headers())
    stream.handle(body(b"{}"))
    for kind in ("response_headers", "response_body", "response_trailers"):
        message = pb.ProcessingRequest(**{kind: {}})
        [answer] = stream.handle(message)
        assert answer.WhichOneof("response") == kind
        assert answer == pb.ProcessingResponse(**{kind: {}})


def test_request_id_from_the_headers_is_on_every_log_line(caplog):
    caplog.set_level(logging.DEBUG, logger="pointsman_picker")
    stream = FakeRouter(errors.BadRequest("nope")).stream()
    stream.handle(post_headers(("x-request-id", "req-42")))
    stream.handle(body(b"{}"))
    assert stream.request_id == "req-42"
    lines = [r.getMessage() for r in caplog.records]
    assert lines
    assert all(line.startswith("[req-42] ") for line in lines)


def test_request_id_is_made_up_when_absent():
    stream = FakeRouter().stream()
    stream.handle(post_headers())
    assert len(stream.request_id) == 36


def test_second_headers_message_is_a_protocol_error():
    stream = FakeRouter().stream()
    stream.handle(post_headers())
    [answer] = stream.handle(post_headers())
    assert answer.immediate_response.status.code == 500
