"""A response body chunk read off the wire agrees with protobuf's decode, and anything else is left to it."""

from __future__ import annotations

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from hypothesis import given
from hypothesis import strategies as st

from pointsman_picker.context import RequestContext
from pointsman_picker.extproc import servicer
from pointsman_picker.extproc.response_chunk import response_body
from pointsman_picker.extproc.servicer import PROCESS_PATH, ExtProcService, native_methods
from pointsman_picker.extproc.stream import StreamSettings
from pointsman_picker.routing import Completion, Routing


def wire(message: pb.ProcessingRequest) -> bytes:
    return message.SerializeToString()


def chunk(
    data: bytes, end_of_stream: bool = False, metadata: base_pb2.Metadata | None = None
) -> pb.ProcessingRequest:
    message = pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=end_of_stream))
    if metadata is not None:
        message.metadata_context.CopyFrom(metadata)  # present, even when empty, as Envoy sends it
    return message


FORWARDED = base_pb2.Metadata()
FORWARDED.filter_metadata["envoy.lb"]["pod"] = "10.0.0.1:8000"
# A token's chunk in the shape Envoy 1.40 sends (seen on the wire): the body, then an empty
# metadata_context (42 00), which Envoy sends with every message.
ENVOY_CHUNK = bytes.fromhex("2a0f0a0d646174613a207b7d0a0a0a0a0a4200")


@pytest.mark.parametrize(
    ("data", "end_of_stream"),
    [
        (b"data: {}\n\n", False),
        (b"data: [DONE]\n\n", True),
        (b"", True),  # the empty last chunk Envoy sends after a chunked body
        (b"", False),
        (b"x" * 127, False),  # one-byte lengths end at 127
        (b"x" * 128, True),
        (b"x" * 70_000, False),  # three-byte lengths
    ],
)
@pytest.mark.parametrize(
    "metadata", [None, base_pb2.Metadata(), FORWARDED], ids=["no-metadata", "empty-metadata", "metadata"]
)
def test_a_response_body_reads_as_protobuf_decodes_it(data, end_of_stream, metadata):
    payload = wire(chunk(data, end_of_stream, metadata))
    decoded = pb.ProcessingRequest.FromString(payload).response_body
    assert response_body(payload) == (decoded.body, decoded.end_of_stream) == (data, end_of_stream)


def test_envoys_chunk_with_its_empty_metadata_context_is_read():
    decoded = pb.ProcessingRequest.FromString(ENVOY_CHUNK)
    assert decoded.HasField("metadata_context")
    assert response_body(ENVOY_CHUNK) == (decoded.response_body.body, False) == (b"data: {}\n\n\n\n\n", False)


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"", id="empty"),
        pytest.param(wire(pb.ProcessingRequest(request_body=pb.HttpBody(body=b"x"))), id="request-body"),
        pytest.param(wire(pb.ProcessingRequest(response_headers=pb.HttpHeaders())), id="response-headers"),
        pytest.param(
            wire(
                pb.ProcessingRequest(
                    response_body=pb.HttpBody(body=b"x"),
                    protocol_config=pb.ProtocolConfiguration(
                        response_body_mode=processing_mode_pb2.ProcessingMode.STREAMED
                    ),
                )
            ),
            id="another-field-after",
        ),
        pytest.param(wire(chunk(b"abc"))[:-1], id="cut-short"),
        pytest.param(wire(chunk(b"abc")) + b"\x00", id="a-byte-more"),
        pytest.param(b"\x2a\x05\x0a\x09abc", id="body-longer-than-its-message"),
        pytest.param(b"\x2a\x02\x18\x01", id="unknown-field-in-the-body"),
        pytest.param(wire(chunk(b"abc", metadata=FORWARDED))[:-1], id="metadata-cut-short"),
        pytest.param(wire(chunk(b"abc", metadata=base_pb2.Metadata())) + b"\x00", id="a-byte-after-metadata"),
        pytest.param(
            wire(chunk(b"abc", metadata=base_pb2.Metadata()))
            + wire(pb.ProcessingRequest(observability_mode=True)),
            id="another-field-after-metadata",
        ),
        pytest.param(b"\x2a\x03\x0a\x01a\x42", id="metadata-without-its-length"),
        pytest.param(b"\x2a\x03\x0a\x05abc\x42\x00", id="body-past-its-message-into-metadata"),
        pytest.param(b"\x2a\xff", id="varint-cut"),
        pytest.param(b"\x2a" + b"\xff" * 12, id="varint-too-long"),
    ],
)
def test_anything_else_is_left_to_the_full_decode(payload):
    assert response_body(payload) is None


# -- the reader against protobuf, on any input ------------------------------------------------------------
@given(st.binary(max_size=300), st.booleans(), st.sampled_from([None, base_pb2.Metadata(), FORWARDED]))
def test_any_response_body_reads_as_protobuf_decodes_it(data, end_of_stream, metadata):
    payload = wire(chunk(data, end_of_stream, metadata))
    assert response_body(payload) == (data, end_of_stream)


@given(st.binary(max_size=64))
def test_any_bytes_read_as_protobuf_decodes_them_or_are_left_to_it(payload):
    found = response_body(payload)
    if found is None:
        return
    decoded = pb.ProcessingRequest.FromString(payload)
    assert decoded.WhichOneof("request") == "response_body"
    assert found == (decoded.response_body.body, decoded.response_body.end_of_stream)


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        pytest.param(b"\x2a\x83\x00\x0a\x01a", (b"a", False), id="a-length-in-two-bytes-not-minimal"),
        pytest.param(b"\x2a\x05\x0a\x82\x00ab", (b"ab", False), id="a-body-length-not-minimal"),
        pytest.param(b"\x2a\x03\x0a\x01a\x42\x00\x42\x00", None, id="metadata-twice"),
        pytest.param(b"\x2a\x04\x0a\x82\x00a", None, id="a-body-cut-short"),
    ],
)
def test_odd_encodings_read_as_protobuf_decodes_them_or_are_left_to_it(payload, expected):
    assert response_body(payload) == expected
    if expected is not None:
        decoded = pb.ProcessingRequest.FromString(payload).response_body
        assert expected == (decoded.body, decoded.end_of_stream)


# -- the native service answers the same with the reader as with the full decode -------------------------
class Sent:
    """The native call's response side: what was sent, and how it finished."""

    metadata = ()

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.finished: list[tuple[int, str]] = []

    def send(self, payload: bytes) -> None:
        self.sent.append(payload)

    def finish(self, status: int = 0, message: str = "") -> None:
        self.finished.append((status, message))


REQUEST_BODY = b'{"model": "m", "stream": true, "stream_options": {"include_usage": true}}'
EVENT = b'data: {"choices":[{"text":" tok"}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":6,"completion_tokens":2}}\n\ndata: [DONE]\n\n'


def exchange(response_mode: int, chunks: list[tuple[bytes, bool]], *, routed: bool = True) -> list[bytes]:
    """An SSE completion's messages as Envoy sends them; without ``routed`` the request body never
    came (the response chunks reach a stream that was not routed)."""

    def headers(pairs: dict[str, str]) -> pb.HttpHeaders:
        fields = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
        return pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=fields))

    config = pb.ProtocolConfiguration(
        request_body_mode=processing_mode_pb2.ProcessingMode.BUFFERED, response_body_mode=response_mode
    )
    request = headers({":method": "POST", ":path": "/v1/completions"})
    out = [pb.ProcessingRequest(request_headers=request, protocol_config=config)]
    if routed:
        out.append(pb.ProcessingRequest(request_body=pb.HttpBody(body=REQUEST_BODY, end_of_stream=True)))
    response = headers({":status": "200", "content-type": "text/event-stream"})
    out.append(pb.ProcessingRequest(response_headers=response))
    out += [chunk(data, end_of_stream, base_pb2.Metadata()) for data, end_of_stream in chunks]
    return [m.SerializeToString() for m in out]


def serve(
    messages: list[bytes], *, reader: bool
) -> tuple[list[bytes], list[tuple[int, str]], list[Completion]]:
    done: list[Completion] = []

    def route(context: RequestContext) -> Routing:
        return Routing("10.0.0.1:8000", context.body, rewritten=False, model="m", target="m")

    service = ExtProcService(
        route,
        StreamSettings(max_body_bytes=1 << 20, destination_header="x-dest", metadata_namespace="envoy.lb"),
        on_error=lambda _: None,
        on_complete=done.append,
        on_finish=lambda _: None,
        clock=lambda: 0.0,
    )
    sent = Sent()
    call = native_methods(service)[PROCESS_PATH](sent)
    original = servicer.response_body
    servicer.response_body = original if reader else (lambda _: None)  # type: ignore[assignment]
    try:
        for payload in messages:
            call.message(payload)
    finally:
        servicer.response_body = original
    return sent.sent, sent.finished, done


MODES = [processing_mode_pb2.ProcessingMode.STREAMED, processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED]
CHUNKS = {
    "tokens then usage": [(EVENT, False), (EVENT, False), (USAGE, True)],
    "an empty last chunk": [(EVENT, False), (USAGE, False), (b"", True)],
    "usage split across chunks": [(USAGE[:30], False), (USAGE[30:], True)],
    "chunks after the end": [(USAGE, True), (EVENT, False)],
    "a long event": [(b"data: " + b"x" * 20_000 + b"\n\n", False), (b"", True)],
}


@pytest.mark.parametrize("chunks", CHUNKS.values(), ids=CHUNKS.keys())
@pytest.mark.parametrize("mode", MODES, ids=["streamed", "full-duplex"])
@pytest.mark.parametrize("routed", [True, False], ids=["routed", "no-request-body"])
def test_the_reader_answers_as_the_full_decode_does(chunks, mode, routed):
    messages = exchange(mode, chunks, routed=routed)
    assert serve(messages, reader=True) == serve(messages, reader=False)


@given(
    st.lists(st.tuples(st.binary(max_size=80), st.booleans()), max_size=8),
    st.sampled_from(MODES),
    st.booleans(),
)
def test_any_chunks_are_answered_as_the_full_decode_answers_them(chunks, mode, routed):
    messages = exchange(mode, chunks, routed=routed)
    assert serve(messages, reader=True) == serve(messages, reader=False)
