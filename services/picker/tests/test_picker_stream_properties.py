"""Properties of the per-stream state machine (``extproc/stream.py``) fed arbitrary ext_proc messages:
it never raises, every answer is a well-formed ProcessingResponse, an error is a JSON ImmediateResponse
with one of the picker's statuses and ends the stream, and (with the real director) a body is routed
exactly when it is a JSON object with a string model the config knows."""

from __future__ import annotations

import itertools
import json
import random
import time
from collections.abc import Callable

import orjson
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from hypothesis import event, given
from hypothesis import strategies as st
from picker_builders import NOW, config, pod, set_headers, snapshot
from prometheus_client import CollectorRegistry

from pointsman_picker import errors
from pointsman_picker.body import parse_body
from pointsman_picker.context import RequestContext
from pointsman_picker.director import Director
from pointsman_picker.extproc.stream import Phase, RequestStream, StreamSettings
from pointsman_picker.metrics import PickerMetrics
from pointsman_picker.routing import Completion, Routing
from pointsman_picker.snapshots import StaticSnapshotSource

MODE = processing_mode_pb2.ProcessingMode
MODES = [MODE.NONE, MODE.STREAMED, MODE.BUFFERED, MODE.BUFFERED_PARTIAL, MODE.FULL_DUPLEX_STREAMED]
ERROR_STATUSES = {400, 404, 413, 429, 500, 503}
MAX_BODY = 100
LISTING = b'{"object":"list","data":[{"id":"my-model"}]}'
SETTINGS = StreamSettings(
    max_body_bytes=MAX_BODY,
    destination_header="x-dest",
    metadata_namespace="envoy.lb",
    explain_header="x-explain",
    models_listing=LISTING,
)

# Header names Envoy and the picker care about, and any other; values as text or as raw bytes (not UTF-8
# too: Envoy passes them as they came).
HEADER_NAMES = st.sampled_from(
    [
        ":method",
        ":path",
        ":status",
        "x-request-id",
        "content-type",
        "x-explain",
        "x-gateway-inference-objective",
    ]
) | st.text(max_size=20)
HEADER_TEXT = st.sampled_from(
    ["GET", "POST", "/v1/models", "/v1/models/?a", "200", "²", "١٢", "text/event-stream"]
)
HEADER_VALUES = st.one_of(
    st.builds(lambda v: base_pb2.HeaderValue(raw_value=v), st.binary(max_size=40)),
    st.builds(lambda v: base_pb2.HeaderValue(raw_value=v.encode()), HEADER_TEXT | st.text(max_size=300)),
    st.builds(lambda v: base_pb2.HeaderValue(value=v), HEADER_TEXT | st.text(max_size=20)),
)


@st.composite
def header_maps(draw: st.DrawFn) -> pb.HttpHeaders:
    entries = []
    if draw(st.booleans()):  # what Envoy always sends, then anything
        for name, values in ((":method", ["GET", "POST"]), (":path", ["/v1/models", "/v1/completions"])):
            entries.append(base_pb2.HeaderValue(key=name, raw_value=draw(st.sampled_from(values)).encode()))
    for name, value in draw(st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=6)):
        value.key = name
        entries.append(value)
    return pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=entries), end_of_stream=draw(st.booleans()))


BODY_BYTES = st.one_of(
    st.binary(max_size=40),
    st.sampled_from(
        [b"{}", b'{"model":"my-model"}', b'{"model":"nope"}', b'{"model":1}', b"null", b"[", b"\xff"]
    ),
    st.just(b"x" * (MAX_BODY + 1)),
)
BODIES = st.builds(pb.HttpBody, body=BODY_BYTES, end_of_stream=st.booleans())

MESSAGES = st.one_of(
    st.builds(pb.ProcessingRequest, request_headers=header_maps()),
    st.builds(pb.ProcessingRequest, request_body=BODIES),
    st.just(pb.ProcessingRequest(request_trailers=pb.HttpTrailers())),
    st.builds(pb.ProcessingRequest, response_headers=header_maps()),
    st.builds(pb.ProcessingRequest, response_body=BODIES),
    st.just(pb.ProcessingRequest(response_trailers=pb.HttpTrailers())),
    st.just(pb.ProcessingRequest()),  # no phase at all
)


@st.composite
def message_sequences(draw: st.DrawFn) -> list[pb.ProcessingRequest]:
    messages = draw(st.lists(MESSAGES, min_size=1, max_size=10))
    for message in messages:
        if draw(st.integers(0, 4)) == 0:  # Envoy sends it on the first; here it may come anywhere
            modes = st.sampled_from(MODES) | st.integers(0, 10)
            message.protocol_config.request_body_mode = draw(modes)
            message.protocol_config.response_body_mode = draw(modes)
    return messages


# What a router may do: route (rewritten or not, with or without a body), or fail as the director can.
OUTCOMES = st.sampled_from(
    [
        "route",
        "rewrite",
        "empty",
        lambda: errors.BadRequest("bad"),
        lambda: errors.UnknownModel("who"),
        lambda: errors.BodyTooLarge("big"),
        lambda: errors.NoCapacity("full", explain="pods=1; dropped"),
        lambda: errors.NoEndpoints("none"),
        lambda: errors.Internal("oops"),
        lambda: KeyError("a bug"),
        lambda: RecursionError("deep"),
    ]
)


class Recorder:
    def __init__(self, route: Callable[[bytes | None, bool, str | None], Routing]) -> None:
        self.errors: list[errors.PickerError] = []
        self.done: list[Completion] = []
        self.now = 0.0
        self.stream = RequestStream(
            route, SETTINGS, on_error=self.errors.append, on_complete=self.done.append, clock=self.clock
        )

    def clock(self) -> float:
        self.now += 0.25
        return self.now


# The answer kinds each message may get (a full-duplex body's last message also answers the headers).
ALLOWED = {
    "request_headers": {"request_headers", "immediate_response"},
    "request_body": {"request_headers", "request_body", "immediate_response"},
    "request_trailers": {"request_headers", "request_body", "request_trailers", "immediate_response"},
    "response_headers": {"response_headers"},
    "response_body": {"response_body"},
    "response_trailers": {"response_trailers"},
    None: set(),
}


def check_answer(answer: pb.ProcessingResponse) -> None:
    kind = answer.WhichOneof("response")
    assert kind is not None
    assert pb.ProcessingResponse.FromString(answer.SerializeToString()) == answer
    if kind != "immediate_response":
        return
    immediate = answer.immediate_response
    headers = {h.header.key: h.header.raw_value for h in immediate.headers.set_headers}
    assert headers["content-type"] == b"application/json"
    if immediate.status.code == 200:
        assert immediate.body == LISTING
        return
    assert immediate.status.code in ERROR_STATUSES
    doc = orjson.loads(immediate.body)
    assert set(doc) == {"error"}
    assert doc["error"]["code"] == immediate.status.code
    assert isinstance(doc["error"]["message"], str)


def run(recorder: Recorder, messages: list[pb.ProcessingRequest]) -> list[list[pb.ProcessingResponse]]:
    """Every message's answers, each checked; once the stream answered itself, nothing more comes."""
    stream = recorder.stream
    all_answers = []
    ended = False
    for message in messages:
        answers = stream.handle(message)
        all_answers.append(answers)
        kinds = {a.WhichOneof("response") for a in answers}
        assert kinds <= ALLOWED[message.WhichOneof("request")]
        for answer in answers:
            check_answer(answer)
        if ended:
            assert answers == []
        if "immediate_response" in kinds:
            assert len(answers) == 1
            assert stream.phase in (Phase.FAILED, Phase.ANSWERED)
            ended = True
    assert len(stream.request_id) <= 128
    return all_answers


@given(message_sequences(), st.lists(OUTCOMES, min_size=1, max_size=3))
def test_any_message_sequence_gets_valid_answers_and_an_error_ends_the_stream(
    messages: list[pb.ProcessingRequest], outcomes: list[str | Callable[[], Exception]]
) -> None:
    calls: list[bytes | None] = []

    def route(context: RequestContext) -> Routing:
        body = context.body
        outcome = outcomes[len(calls) % len(outcomes)]
        calls.append(body)
        if callable(outcome):
            raise outcome()
        if outcome == "rewrite" and body is not None:  # as the director: no body, no rewrite
            return Routing("10.0.0.9:8000", b'{"model":"t"}', rewritten=True, model="m", target="t")
        return Routing("10.0.0.9:8000", None if outcome == "empty" else body, rewritten=False, model="m")

    recorder = Recorder(route)
    answers = run(recorder, messages)
    errors_sent = [a for batch in answers for a in batch if a.HasField("immediate_response")]
    statuses = [
        a.immediate_response.status.code for a in errors_sent if a.immediate_response.status.code != 200
    ]
    assert statuses == [e.status for e in recorder.errors]  # each error counted once, as answered
    assert len(calls) <= 1  # one decision per stream
    assert len(recorder.done) <= 1  # one completion per stream
    event(recorder.stream.phase.value)


# With the real director: a request as Envoy sends it, its body cut into chunks as Envoy may.
KNOWN = {"my-model": "my-model-12345", "sql-lora": "sql-lora-1fdg2", "plain": "plain"}
DOCS = st.one_of(
    st.fixed_dictionaries(
        {"model": st.sampled_from([*KNOWN, "nope", ""]) | st.text(max_size=8)},
        optional={"prompt": st.text(max_size=20), "max_tokens": st.integers(0, 100)},
    ),
    st.fixed_dictionaries({"model": st.integers() | st.none() | st.lists(st.text(), max_size=2)}),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
    st.lists(st.integers(), max_size=3),
)
ROUTABLE = st.fixed_dictionaries(
    {"model": st.sampled_from(sorted(KNOWN))},
    optional={"prompt": st.text(max_size=20), "stream": st.booleans()},
)
REQUEST_BODIES = st.one_of(
    st.builds(lambda doc: json.dumps(doc).encode(), ROUTABLE),
    st.builds(lambda doc: json.dumps(doc, separators=(",", ":")).encode(), ROUTABLE),
    st.builds(lambda doc: json.dumps(doc).encode(), DOCS),
    st.binary(max_size=MAX_BODY + 10),
    st.builds(lambda doc, cut: json.dumps(doc).encode()[:cut], DOCS, st.integers(0, 30)),
)


@st.composite
def chunked(draw: st.DrawFn, data: bytes, whole: bool) -> list[bytes]:
    if whole:  # BUFFERED: Envoy sends the body in one message
        return [data]
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=4)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def director() -> Director:
    source = StaticSnapshotSource(snapshot(pod(address="10.0.0.1:8000")))
    return Director(
        config(),
        source,
        PickerMetrics(CollectorRegistry()),
        rng=random.Random(1),
        clock=lambda: NOW,
        timer=time.perf_counter,
    )


def expected_status(data: bytes) -> int | str:
    """The oracle: 413 over the cap, else what parse_body and the config say."""
    if len(data) > MAX_BODY:
        return 413
    try:
        body = parse_body(data)
    except errors.BadRequest:
        return 400
    return KNOWN.get(body.model, 404)


@given(st.data(), REQUEST_BODIES, st.sampled_from(MODES), st.booleans())
def test_a_body_is_routed_exactly_when_it_names_a_known_model(
    data: st.DataObject, raw: bytes, mode: int, trailers: bool
) -> None:
    whole = mode in (MODE.BUFFERED, MODE.BUFFERED_PARTIAL)
    chunks = data.draw(chunked(raw, whole))
    recorder = Recorder(director().route)
    first = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=":method", raw_value=b"POST")])
        )
    )
    first.protocol_config.request_body_mode = mode
    messages = [first]
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        messages.append(
            pb.ProcessingRequest(request_body=pb.HttpBody(body=chunk, end_of_stream=last and not trailers))
        )
    if trailers:
        messages.append(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()))
    answers = [a for batch in run(recorder, messages) for a in batch]
    want = expected_status(raw)
    event(f"{want if isinstance(want, int) else 'routed'}, mode {mode}")
    if isinstance(want, int):
        [error] = [a for a in answers if a.HasField("immediate_response")]
        assert error.immediate_response.status.code == want
        assert recorder.stream.phase is Phase.FAILED
        return
    assert recorder.stream.phase is Phase.ROUTED
    routed = [a for a in answers if a.WhichOneof("response") in ("request_headers", "request_body")]
    if mode == MODE.FULL_DUPLEX_STREAMED:
        head, *streamed = routed
        sent = set_headers(head, "request_headers")
        forwarded = b"".join(a.request_body.response.body_mutation.streamed_response.body for a in streamed)
        assert streamed[-1].request_body.response.body_mutation.streamed_response.end_of_stream
    else:
        assert len([a for a in routed if a.HasField("request_body")]) == len(chunks)  # one answer per chunk
        head = routed[-1]
        sent = set_headers(head)
        mutation = head.request_body.response.body_mutation
        forwarded = mutation.body if mutation.HasField("body") else raw
    assert sent["x-dest"] == "10.0.0.1:8000"
    assert sent["Content-Length"] == str(len(forwarded))
    assert parse_body(forwarded).model == want


@given(header_maps(), header_maps())
def test_headers_of_any_shape_never_break_a_stream(
    request_headers: pb.HttpHeaders, response: pb.HttpHeaders
) -> None:
    recorder = Recorder(director().route)
    messages = [
        pb.ProcessingRequest(request_headers=request_headers),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=b'{"model":"my-model"}', end_of_stream=True)),
        pb.ProcessingRequest(response_headers=response),
        pb.ProcessingRequest(response_body=pb.HttpBody(body=b'{"usage":{}}', end_of_stream=True)),
    ]
    run(recorder, messages)
    if recorder.done:
        [done] = recorder.done
        assert 0 <= done.status <= 999


STATUS_TEXT = st.text(max_size=6) | st.sampled_from(["200", "²", "١٢٣", "0200", "-1", " 200", "9" * 5000])


@given(STATUS_TEXT, st.booleans())
def test_any_response_status_text_is_counted_as_a_status_or_zero(status: str, raw: bool) -> None:
    recorder = Recorder(director().route)
    entry = base_pb2.HeaderValue(key=":status", raw_value=status.encode()) if raw else None
    entry = entry or base_pb2.HeaderValue(key=":status", value=status)
    messages = [
        pb.ProcessingRequest(request_headers=pb.HttpHeaders(end_of_stream=True)),
        pb.ProcessingRequest(
            response_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[entry]), end_of_stream=True)
        ),
    ]
    run(recorder, messages)
    [done] = recorder.done
    expected = int(status) if len(status) <= 3 and status.isascii() and status.isdigit() else 0
    assert done.status == expected
