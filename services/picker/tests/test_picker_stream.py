"""The per-stream state machine, with a fake router (no gRPC, no snapshot)."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from picker_builders import body, headers, post_headers, set_headers

from pointsman_picker import errors
from pointsman_picker.context import RequestContext
from pointsman_picker.director import Routing
from pointsman_picker.extproc.stream import Completion, Phase, RequestStream, StreamSettings
from pointsman_picker.extproc.usage import Usage

SETTINGS = StreamSettings(max_body_bytes=10, destination_header="x-dest", metadata_namespace="envoy.lb")
ROOMY = StreamSettings(max_body_bytes=200_000, destination_header="x-dest", metadata_namespace="envoy.lb")


class FakeRouter:
    def __init__(self, fail: Exception | None = None, *, rewrite: bytes | None = None) -> None:
        self.bodies: list[bytes | None] = []
        self.errors: list[errors.PickerError] = []
        self.done: list[Completion] = []
        self.explained: list[bool] = []
        self.objectives: list[str | None] = []
        self.contexts: list[RequestContext] = []
        self.fail = fail
        self.rewrite = rewrite
        self.now = 0.0

    def route(self, context: RequestContext) -> Routing:
        data = context.body
        self.contexts.append(context)
        self.bodies.append(data)
        self.explained.append(context.explain)
        self.objectives.append(context.objective)
        if self.fail is not None:
            raise self.fail
        if self.rewrite is not None:
            return Routing("10.0.0.9:8000", self.rewrite, rewritten=True, model="m", target="t")
        return Routing("10.0.0.9:8000", data, rewritten=False, model="m", target="m", explain="path")

    def stream(self, settings: StreamSettings = SETTINGS) -> RequestStream:
        return RequestStream(
            self.route, settings, on_error=self.errors.append, on_complete=self.done.append, clock=self.clock
        )

    def clock(self) -> float:
        self.now += 0.5
        return self.now


MODE = processing_mode_pb2.ProcessingMode


def with_modes(message: pb.ProcessingRequest, *, request: int = 0, response: int = 0) -> pb.ProcessingRequest:
    """The first message of a stream, as Envoy sends it: with the body modes it was configured with."""
    message.protocol_config.request_body_mode = request
    message.protocol_config.response_body_mode = response
    return message


def response_headers(*pairs: tuple[str, str], end_of_stream: bool = False) -> pb.ProcessingRequest:
    request = headers(*pairs, end_of_stream=end_of_stream)
    return pb.ProcessingRequest(response_headers=request.request_headers)


def response_body(data: bytes, *, end_of_stream: bool = False) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=end_of_stream))


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


def test_streamed_chunks_are_answered_in_order_once_the_body_is_complete():
    router = FakeRouter()
    stream = router.stream()
    stream.handle(with_modes(post_headers(), request=MODE.STREAMED))
    assert stream.handle(body(b"ab", end_of_stream=False)) == []
    assert stream.handle(body(b"cd", end_of_stream=False)) == []
    answers = stream.handle(body(b"ef"))
    assert kinds(answers) == ["request_body"] * 3
    assert router.bodies == [b"abcdef"]
    # Not rewritten: the chunks pass as they are; the last answer carries the route.
    assert answers[0] == answers[1] == pb.ProcessingResponse(request_body=pb.BodyResponse())
    assert set_headers(answers[2]) == {"x-dest": "10.0.0.9:8000", "Content-Length": "6"}
    assert not answers[2].request_body.response.HasField("body_mutation")


def test_a_rewritten_streamed_body_clears_the_early_chunks():
    router = FakeRouter(rewrite=b'{"model":"t"}')
    stream = router.stream(ROOMY)
    stream.handle(with_modes(post_headers(), request=MODE.STREAMED))
    stream.handle(body(b'{"model"', end_of_stream=False))
    first, last = stream.handle(body(b':"m"}'))
    assert first.request_body.response.body_mutation.clear_body
    assert last.request_body.response.body_mutation.body == b'{"model":"t"}'
    assert set_headers(last)["Content-Length"] == "13"


def early_body(message: pb.ProcessingRequest) -> pb.ProcessingRequest:
    """The first message where Envoy sends a STREAMED body without waiting for the header answer."""
    with_modes(message, request=MODE.STREAMED)
    message.protocol_config.send_body_without_waiting_for_header_response = True
    return message


@pytest.mark.parametrize(
    ("rewrite", "early", "last"),
    [
        (None, pb.BodyResponse(), pb.BodyResponse()),  # the chunks pass as they are
        (
            b'{"model":"t"}',
            pb.BodyResponse(response=pb.CommonResponse(body_mutation=pb.BodyMutation(clear_body=True))),
            pb.BodyResponse(response=pb.CommonResponse(body_mutation=pb.BodyMutation(body=b'{"model":"t"}'))),
        ),
    ],
)
def test_a_body_sent_without_waiting_gets_the_route_in_the_held_header_answer(rewrite, early, last):
    router = FakeRouter(rewrite=rewrite)
    stream = router.stream(ROOMY)
    assert stream.handle(early_body(post_headers())) == []  # held: it carries the route
    assert stream.handle(body(b'{"model"', end_of_stream=False)) == []
    answers = stream.handle(body(b':"m"}'))
    assert kinds(answers) == ["request_headers", "request_body", "request_body"]
    assert set_headers(answers[0], "request_headers") == {
        "x-dest": "10.0.0.9:8000",
        "Content-Length": str(len(rewrite or b'{"model":"m"}')),
    }
    assert answers[0].request_headers.response.clear_route_cache
    assert [a.request_body for a in answers[1:]] == [early, last]


def test_a_body_sent_without_waiting_ended_by_trailers():
    router = FakeRouter()
    stream = router.stream()
    stream.handle(early_body(post_headers()))
    stream.handle(body(b"{}", end_of_stream=False))
    trailers = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())
    assert kinds(stream.handle(trailers)) == ["request_headers", "request_body", "request_trailers"]


@pytest.mark.parametrize(
    ("size", "chunks"), [(0, [0]), (5, [5]), (62_000, [62_000]), (130_000, [62_000, 62_000, 6_000])]
)
def test_full_duplex_answers_headers_then_the_body_in_chunks(size, chunks):
    router = FakeRouter()
    stream = router.stream(ROOMY)
    assert stream.handle(with_modes(post_headers(), request=MODE.FULL_DUPLEX_STREAMED)) == []
    data = b"x" * size
    assert stream.handle(body(data[:3], end_of_stream=False)) == []
    answers = stream.handle(body(data[3:]))
    assert kinds(answers) == ["request_headers"] + ["request_body"] * len(chunks)
    header_answer = answers[0]
    assert set_headers(header_answer, "request_headers") == {
        "x-dest": "10.0.0.9:8000",
        "Content-Length": str(size),
    }
    assert header_answer.request_headers.response.clear_route_cache
    streamed = [a.request_body.response.body_mutation.streamed_response for a in answers[1:]]
    assert [len(s.body) for s in streamed] == chunks
    assert [s.end_of_stream for s in streamed] == [False] * (len(chunks) - 1) + [True]
    assert b"".join(s.body for s in streamed) == data


def test_full_duplex_body_ended_by_trailers():
    router = FakeRouter()
    stream = router.stream()
    stream.handle(with_modes(post_headers(), request=MODE.FULL_DUPLEX_STREAMED))
    stream.handle(body(b"{}", end_of_stream=False))
    trailers = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())
    assert kinds(stream.handle(trailers)) == ["request_headers", "request_body", "request_trailers"]


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


LISTING = b'{"object":"list","data":[{"id":"my-model"}]}'


@pytest.mark.parametrize(
    ("method", "path", "listed"),
    [
        ("GET", "/v1/models", True),
        ("GET", "/v1/models/?x=1", True),
        ("POST", "/v1/models", False),
        ("GET", "/v1/models/my-model", False),
        ("GET", "/health", False),
    ],
)
def test_get_v1_models_is_answered_with_the_listing(method, path, listed):
    router = FakeRouter()
    settings = dataclasses.replace(SETTINGS, models_listing=LISTING)
    answers = router.stream(settings).handle(
        headers((":method", method), (":path", path), end_of_stream=True)
    )
    if listed:
        [answer] = answers
        assert answer.immediate_response.status.code == 200
        assert answer.immediate_response.body == LISTING
        assert router.bodies == []  # not routed
    else:
        assert router.bodies == [None]


def test_without_a_listing_get_v1_models_goes_to_a_pod():
    router = FakeRouter()
    router.stream().handle(headers((":method", "GET"), (":path", "/v1/models"), end_of_stream=True))
    assert router.bodies == [None]


@pytest.mark.parametrize(
    ("sent", "objective"),
    [((), None), ((("x-gateway-inference-objective", "batch"),), "batch")],
)
def test_the_objective_header_goes_to_the_router(sent, objective):
    router = FakeRouter()
    router.stream().handle(headers((":method", "GET"), *sent, end_of_stream=True))
    assert router.objectives == [objective]


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


SSE = (
    b'data: {"choices":[{"text":"a"}]}\n\ndata: {"choices":[],"us',
    b'age":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}\n\ndata: [DONE]\n\n',
)


ASKS_FOR_USAGE = b'{"stream":true,"stream_options":{"include_usage":true}}'


@pytest.mark.parametrize(
    ("content_type", "chunks", "usage"),
    [
        ("application/json", (b'{"usage":{"prompt_tokens":5,', b'"completion_tokens":2}}'), Usage(5, 2)),
        ("text/event-stream; charset=utf-8", SSE, Usage(7, 3)),
        ("text/event-stream", SSE[:1], None),
        ("application/json", (b"not json",), None),
    ],
)
@pytest.mark.parametrize("mode", [MODE.STREAMED, MODE.FULL_DUPLEX_STREAMED])
def test_the_response_is_counted_and_passed_through_untouched(content_type, chunks, usage, mode):
    router = FakeRouter()
    stream = router.stream(ROOMY)
    stream.handle(with_modes(post_headers(), response=mode))
    stream.handle(body(ASKS_FOR_USAGE))
    [answer] = stream.handle(response_headers((":status", "200"), ("content-type", content_type)))
    assert answer == pb.ProcessingResponse(response_headers=pb.HeadersResponse())
    for i, chunk in enumerate(chunks):
        [answer] = stream.handle(response_body(chunk, end_of_stream=i == len(chunks) - 1))
        if mode == MODE.FULL_DUPLEX_STREAMED:  # that mode needs every byte handed back
            assert answer.response_body.response.body_mutation.streamed_response.body == chunk
        else:
            assert answer == pb.ProcessingResponse(response_body=pb.BodyResponse())
    size = sum(len(c) for c in chunks)
    assert router.done == [Completion("m", "m", 0, 200, 0.5, len(ASKS_FOR_USAGE), size, usage)]
    assert stream.phase is Phase.DONE


def test_a_header_only_response_completes():
    router = FakeRouter()
    stream = router.stream()
    stream.handle(post_headers())
    stream.handle(body(b"{}"))
    stream.handle(response_headers((":status", "503"), end_of_stream=True))
    [done] = router.done
    assert (done.status, done.response_bytes, done.usage) == (503, 0, None)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        # Response headers shown, body not: Envoy holds the stream to the response's end, which is then
        # the exchange's end (no size, no usage).
        (MODE.NONE, [Completion("m", "m", 0, 200, 0.5, 2, None, None)]),
        # The body shown but cut before its end: not a completed exchange.
        (MODE.STREAMED, []),
    ],
)
def test_a_response_whose_body_is_not_shown_completes_when_the_stream_ends(mode, expected):
    router = FakeRouter()
    stream = router.stream()
    stream.handle(with_modes(post_headers(), response=mode))
    stream.handle(body(b"{}"))
    stream.handle(response_headers((":status", "200"), ("content-type", "application/json")))
    assert router.done == []
    stream.closed()
    assert router.done == expected


@pytest.mark.parametrize(
    ("request_body", "content_type", "declined"),
    [
        (b'{"stream":true}', "text/event-stream", True),  # no usage will come: nothing to count
        (ASKS_FOR_USAGE, "text/event-stream", False),
        (b'{"stream":false}', "application/json", False),  # JSON always carries usage
    ],
)
def test_the_body_of_a_stream_without_usage_is_declined(request_body, content_type, declined):
    router = FakeRouter()
    stream = router.stream(ROOMY)
    stream.handle(with_modes(post_headers(), response=MODE.STREAMED))
    stream.handle(body(request_body))
    [answer] = stream.handle(response_headers((":status", "200"), ("content-type", content_type)))
    assert answer.HasField("mode_override") is declined
    if declined:
        assert answer.mode_override.response_body_mode == MODE.NONE
        stream.closed()  # Envoy honoured it: the stream's end is the response's
        assert router.done == [Completion("m", "m", 0, 200, 0.5, len(request_body), None, None)]


def test_a_declined_body_that_comes_anyway_is_counted_as_ever():
    # Without allow_mode_override Envoy ignores the override and shows every chunk.
    router = FakeRouter()
    stream = router.stream(ROOMY)
    stream.handle(with_modes(post_headers(), response=MODE.STREAMED))
    stream.handle(body(b'{"stream":true}'))
    stream.handle(response_headers((":status", "200"), ("content-type", "text/event-stream")))
    [answer] = stream.handle(response_body(b"data: [DONE]\n\n", end_of_stream=True))
    assert answer == pb.ProcessingResponse(response_body=pb.BodyResponse())
    stream.closed()
    assert router.done == [Completion("m", "m", 0, 200, 0.5, 15, 14, None)]


def test_a_stream_closed_before_its_response_completes_nothing():
    router = FakeRouter()
    stream = router.stream()
    stream.handle(with_modes(post_headers(), response=MODE.NONE))
    stream.handle(body(b"{}"))
    stream.closed()
    assert router.done == []


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


EXPLAINING = StreamSettings(10, "x-dest", "envoy.lb", explain_header="x-explain")


@pytest.mark.parametrize(("asked", "settings"), [(True, EXPLAINING), (False, EXPLAINING), (True, SETTINGS)])
def test_the_path_comes_back_in_the_response_only_when_asked_and_enabled(asked, settings):
    router = FakeRouter()
    stream = router.stream(settings)
    stream.handle(post_headers(("x-explain", "1")) if asked else post_headers())
    stream.handle(body(b"{}"))
    [answer] = stream.handle(response_headers((":status", "200")))
    shown = asked and settings.explain_header is not None
    assert router.explained == [shown]
    assert set_headers(answer, "response_headers") == ({"x-explain": "path"} if shown else {})


def test_an_explained_error_carries_the_path():
    router = FakeRouter(errors.NoCapacity("full", explain="pods=1; has capacity:0; dropped"))
    stream = router.stream(EXPLAINING)
    stream.handle(post_headers(("x-explain", "")))
    [answer] = stream.handle(body(b"{}"))
    sent = {h.header.key: h.header.raw_value for h in answer.immediate_response.headers.set_headers}
    assert sent["x-explain"] == b"pods=1; has capacity:0; dropped"


@pytest.mark.parametrize(("sent", "counted"), [("200", 200), ("²", 0), ("١٢٣", 0), ("9" * 5000, 0), ("", 0)])
def test_a_response_status_that_is_not_ascii_digits_counts_as_zero(sent, counted):
    # Found by test_picker_stream_properties: "²" passed str.isdigit() and int() raised out of handle().
    router = FakeRouter()
    stream = router.stream()
    stream.handle(headers((":method", "GET"), end_of_stream=True))
    [answer] = stream.handle(response_headers((":status", sent), end_of_stream=True))
    assert answer == pb.ProcessingResponse(response_headers=pb.HeadersResponse())
    assert [done.status for done in router.done] == [counted]


@pytest.mark.parametrize(
    ("request_mode", "response_mode", "carrier", "route"),
    [
        # Body not shown (the shipped mode, body NONE): the access log brings its size and tokens.
        (MODE.BUFFERED, MODE.NONE, 0, {"model": "m", "target": "m"}),
        (MODE.FULL_DUPLEX_STREAMED, MODE.NONE, 0, {"model": "m", "target": "m"}),
        # Shown: the picker counts it itself, and an access log entry without the route is not counted.
        (MODE.BUFFERED, MODE.STREAMED, 0, None),
    ],
)
def test_the_route_goes_into_the_metadata_when_the_body_is_not_shown(
    request_mode, response_mode, carrier, route
):
    router = FakeRouter()
    stream = router.stream()
    stream.handle(with_modes(post_headers(), request=request_mode, response=response_mode))
    answers = stream.handle(body(b"{}"))
    metadata = answers[carrier].dynamic_metadata.fields
    assert metadata["envoy.lb"].struct_value.fields["x-dest"].string_value == "10.0.0.9:8000"
    if route is None:
        assert "pointsman.route" not in metadata
    else:
        fields = metadata["pointsman.route"].struct_value.fields
        assert {key: value.string_value for key, value in fields.items()} == route


@pytest.mark.parametrize(
    ("router", "end_of_stream", "told"),
    [
        pytest.param(FakeRouter(), False, 1, id="routed, headers then a body: told at the headers"),
        pytest.param(FakeRouter(), True, 1, id="routed, header-only response: told"),
        pytest.param(FakeRouter(errors.BadRequest("no")), False, 0, id="failed: nothing to measure"),
    ],
)
def test_response_headers_tell_the_response_sink_once(router, end_of_stream, told):
    responded: list[Routing] = []
    stream = RequestStream(
        router.route, SETTINGS, on_error=router.errors.append, on_response=responded.append
    )
    stream.handle(post_headers())
    stream.handle(body(b"{}"))
    stream.handle(response_headers((":status", "200"), end_of_stream=end_of_stream))
    assert responded == ([stream.routing] * told if told else [])
