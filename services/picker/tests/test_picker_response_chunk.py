"""A response body chunk read off the wire agrees with protobuf's decode, and anything else is left to it."""

from __future__ import annotations

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from pointsman_picker.extproc.response_chunk import response_body


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
