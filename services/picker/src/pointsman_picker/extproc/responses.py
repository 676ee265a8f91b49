"""Pure builders of the ext_proc ``ProcessingResponse`` messages the picker sends (protobuf only, no gRPC),
and :func:`error_response`, the one place a picker error becomes an Envoy answer."""

from __future__ import annotations

import orjson
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2

from pointsman_picker.errors import PickerError

CONTENT_LENGTH = "Content-Length"
# Envoy's limit for one streamed body mutation in FULL_DUPLEX_STREAMED mode is 64 KiB; upstream
# sends 62,000-byte chunks.
STREAMED_CHUNK_BYTES = 62_000
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def header(name: str, value: str) -> base_pb2.HeaderValueOption:
    # Overwrite, so a client cannot steer routing by sending the destination header itself.
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=name, raw_value=value.encode()), append_action=_OVERWRITE
    )


def with_destination_metadata(
    response: pb.ProcessingResponse, namespace: str, header_name: str, endpoint: str
) -> pb.ProcessingResponse:
    """Set ``dynamic_metadata`` to ``{namespace: {header_name: endpoint}}``."""
    response.dynamic_metadata.get_or_create_struct(namespace)[header_name] = endpoint
    return response


ROUTE_NAMESPACE = "pointsman.route"  # read back from Envoy's access log (pointsman_picker.accesslog)


def with_route_metadata(response: pb.ProcessingResponse, model: str, target: str) -> pb.ProcessingResponse:
    """Add ``{pointsman.route: {model, target}}`` to the answer's ``dynamic_metadata``: Envoy's access log
    entry of the request carries it to whichever picker reads the log, which needs nothing else to
    record the response's size and tokens under the right labels."""
    route = response.dynamic_metadata.get_or_create_struct(ROUTE_NAMESPACE)
    route["model"] = model
    route["target"] = target
    return response


def request_headers_continue() -> pb.ProcessingResponse:
    """The answer to request headers that a body will follow."""
    return REQUEST_HEADERS_CONTINUE


def request_headers_routed(
    endpoint: str, *, destination_header: str, metadata_namespace: str, content_length: int | None = None
) -> pb.ProcessingResponse:
    """The answer to request headers that carries the route: for a request without a body, or (with
    ``content_length``) for a FULL_DUPLEX_STREAMED body, whose header answer waits for the whole body."""
    set_headers = [header(destination_header, endpoint)]
    if content_length is not None:
        set_headers.append(header(CONTENT_LENGTH, str(content_length)))
    response = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(
            response=pb.CommonResponse(
                clear_route_cache=True, header_mutation=pb.HeaderMutation(set_headers=set_headers)
            )
        )
    )
    return with_destination_metadata(response, metadata_namespace, destination_header, endpoint)


def request_body_streamed(body: bytes) -> list[pb.ProcessingResponse]:
    """The whole body as FULL_DUPLEX_STREAMED answers: chunks of at most 62,000 bytes, the last marked
    ``end_of_stream`` (one empty chunk for an empty body)."""
    size = len(body)
    starts = range(0, size, STREAMED_CHUNK_BYTES) if size else range(1)
    return [
        pb.ProcessingResponse(
            request_body=pb.BodyResponse(
                response=pb.CommonResponse(
                    body_mutation=pb.BodyMutation(
                        streamed_response=pb.StreamedBodyResponse(
                            body=body[start : start + STREAMED_CHUNK_BYTES],
                            end_of_stream=start + STREAMED_CHUNK_BYTES >= size,
                        )
                    )
                )
            )
        )
        for start in starts
    ]


def request_body_cleared() -> pb.ProcessingResponse:
    """The answer to an early STREAMED chunk when the body is rewritten: drop it; the last chunk's answer
    carries the whole new body."""
    return pb.ProcessingResponse(
        request_body=pb.BodyResponse(
            response=pb.CommonResponse(body_mutation=pb.BodyMutation(clear_body=True))
        )
    )


def request_body_replaced(body: bytes) -> pb.ProcessingResponse:
    """The answer to the last STREAMED chunk of a rewritten body whose route went in the header
    answer: the whole new body in place of that chunk (the earlier ones were cleared)."""
    return pb.ProcessingResponse(
        request_body=pb.BodyResponse(response=pb.CommonResponse(body_mutation=pb.BodyMutation(body=body)))
    )


def request_body_routed(
    endpoint: str,
    body: bytes,
    *,
    rewritten: bool,
    destination_header: str,
    metadata_namespace: str,
) -> pb.ProcessingResponse:
    """The answer to the (complete) request body: destination header, Content-Length of ``body``,
    destination metadata, and ``body`` itself when it was rewritten."""
    common = pb.CommonResponse(
        header_mutation=pb.HeaderMutation(
            set_headers=[header(destination_header, endpoint), header(CONTENT_LENGTH, str(len(body)))]
        )
    )
    if rewritten:
        common.body_mutation.body = body
    response = pb.ProcessingResponse(request_body=pb.BodyResponse(response=common))
    return with_destination_metadata(response, metadata_namespace, destination_header, endpoint)


def immediate(status: int, body: bytes, *, details: str = "") -> pb.ProcessingResponse:
    """Envoy answers the client with ``status`` and ``body`` (JSON) without going upstream."""
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            headers=pb.HeaderMutation(set_headers=[header("content-type", "application/json")]),
            body=body,
            details=details,
        )
    )


def request_body_continue() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(request_body=pb.BodyResponse())


def request_trailers_continue() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())


def response_headers_continue() -> pb.ProcessingResponse:
    return RESPONSE_HEADERS_CONTINUE


def response_headers_with(name: str, value: str) -> pb.ProcessingResponse:
    """Response headers passed on with one header added (the explained decision)."""
    return pb.ProcessingResponse(
        response_headers=pb.HeadersResponse(
            response=pb.CommonResponse(header_mutation=pb.HeaderMutation(set_headers=[header(name, value)]))
        )
    )


# Answers that never change, built once: a streamed response sends one of these per chunk (per
# token). Shared, so never mutated; SERIALIZED holds each one's wire bytes for the native server.
RESPONSE_BODY_CONTINUE = pb.ProcessingResponse(response_body=pb.BodyResponse())
RESPONSE_HEADERS_CONTINUE = pb.ProcessingResponse(response_headers=pb.HeadersResponse())
REQUEST_HEADERS_CONTINUE = pb.ProcessingResponse(
    request_headers=pb.HeadersResponse(response=pb.CommonResponse(clear_route_cache=True))
)
# The response headers answer that asks Envoy for no more of the response (with allow_mode_override;
# ignored without it): an event stream whose usage nobody asked for has nothing left to count.
_NO_RESPONSE_BODY = processing_mode_pb2.ProcessingMode(
    response_body_mode=processing_mode_pb2.ProcessingMode.NONE
)
RESPONSE_HEADERS_NO_BODY = pb.ProcessingResponse(
    response_headers=pb.HeadersResponse(), mode_override=_NO_RESPONSE_BODY
)
SERIALIZED: dict[int, bytes] = {
    id(answer): answer.SerializeToString()
    for answer in (
        RESPONSE_BODY_CONTINUE,
        RESPONSE_HEADERS_CONTINUE,
        RESPONSE_HEADERS_NO_BODY,
        REQUEST_HEADERS_CONTINUE,
    )
}


def serialized(response: pb.ProcessingResponse) -> bytes:
    """``response`` on the wire (a constant's bytes from :data:`SERIALIZED`, without serializing)."""
    return SERIALIZED.get(id(response)) or response.SerializeToString()


def response_body_continue() -> pb.ProcessingResponse:
    return RESPONSE_BODY_CONTINUE


def response_body_echo(chunk: bytes, end_of_stream: bool) -> pb.ProcessingResponse:
    """A FULL_DUPLEX_STREAMED response chunk handed back unchanged (that mode needs every byte back)."""
    return pb.ProcessingResponse(
        response_body=pb.BodyResponse(
            response=pb.CommonResponse(
                body_mutation=pb.BodyMutation(
                    streamed_response=pb.StreamedBodyResponse(body=chunk, end_of_stream=end_of_stream)
                )
            )
        )
    )


def response_trailers_continue() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


def error_response(error: PickerError, explain_header: str | None = None) -> pb.ProcessingResponse:
    """The ImmediateResponse for ``error``; with ``explain_header``, the scheduling path in that header."""
    body = orjson.dumps({"error": {"code": error.status, "message": error.message}})
    response = immediate(error.status, body, details=f"pointsman_{error.result}")
    if explain_header and error.explain:
        response.immediate_response.headers.set_headers.append(header(explain_header, error.explain))
    return response
