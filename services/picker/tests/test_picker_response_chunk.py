"""A response body chunk read off the wire agrees with protobuf's decode, and anything else is left to it."""

from __future__ import annotations

import pytest
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from pointsman_picker.extproc.response_chunk import response_body


def wire(message: pb.ProcessingRequest) -> bytes:
    return message.SerializeToString()


def chunk(data: bytes, end_of_stream: bool = False) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=end_of_stream))


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
def test_a_response_body_reads_as_protobuf_decodes_it(data, end_of_stream):
    payload = wire(chunk(data, end_of_stream))
    decoded = pb.ProcessingRequest.FromString(payload).response_body
    assert response_body(payload) == (decoded.body, decoded.end_of_stream) == (data, end_of_stream)


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
        pytest.param(b"\x2a\xff", id="varint-cut"),
        pytest.param(b"\x2a" + b"\xff" * 12, id="varint-too-long"),
    ],
)
def test_anything_else_is_left_to_the_full_decode(payload):
    assert response_body(payload) is None
