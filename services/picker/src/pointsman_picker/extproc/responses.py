"""Pure builders of the ext_proc ``ProcessingResponse`` messages the picker sends (protobuf only, no gRPC)."""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2

CONTENT_LENGTH = "Content-Length"
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


def request_headers_continue() -> pb.ProcessingResponse:
    """The answer to request headers that a body will follow."""
    return pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=pb.CommonResponse(clear_route_cache=True))
    )


def request_headers_routed(
    endpoint: str, *, destination_header: str, metadata_namespace: str
) -> pb.ProcessingResponse:
    """The answer to request headers that end the request (no body): the route goes here."""
    response = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(
            response=pb.CommonResponse(
                clear_route_cache=True,
                header_mutation=pb.HeaderMutation(set_headers=[header(destination_header, endpoint)]),
            )
        )
    )
    return with_destination_metadata(response, metadata_namespace, destination_header, endpoint)


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
    return pb.ProcessingResponse(response_headers=pb.HeadersResponse())


def response_body_continue() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(response_body=pb.BodyResponse())


def response_trailers_continue() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
