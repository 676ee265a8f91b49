"""The per-stream state machine of one ext_proc stream (one HTTP request), apart from gRPC.

    HEADERS --headers, end_of_stream--> route without a body --> ROUTED
    HEADERS --headers--> BODY --chunks ... end_of_stream--> route --> ROUTED
    any error (400/404/413/429/500/503) --> FAILED (an ImmediateResponse was sent)

Body chunks accumulate until ``end_of_stream`` (or until the one message of a BUFFERED body, when
Envoy announces its processing mode), capped at ``max_body_bytes`` (413). After the decision,
response-side messages get empty replies.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from pointsman_picker.director import Routing
from pointsman_picker.errors import BodyTooLarge, Internal, PickerError, error_response
from pointsman_picker.extproc import responses

REQUEST_ID_HEADER = "x-request-id"
_WHOLE_BODY_MODES = frozenset(
    {processing_mode_pb2.ProcessingMode.BUFFERED, processing_mode_pb2.ProcessingMode.BUFFERED_PARTIAL}
)

# Load and availability answers (429, 503) can come by the thousand: metrics count them, DEBUG logs them.
_LOG_LEVELS = {429: logging.DEBUG, 503: logging.DEBUG, 500: logging.WARNING}
_MAX_REQUEST_ID = 128

Route = Callable[[bytes | None], Routing]
ErrorSink = Callable[[PickerError], None]

log = logging.getLogger("pointsman_picker.stream")


class Phase(enum.Enum):
    HEADERS = "headers"
    BODY = "body"
    ROUTED = "routed"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class StreamSettings:
    max_body_bytes: int
    destination_header: str
    metadata_namespace: str


class RequestLog(logging.LoggerAdapter[logging.Logger]):
    """Puts the stream's request id on every line."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        return f"[{(self.extra or {}).get('request_id', '-')}] {msg}", kwargs


class RequestStream:
    def __init__(self, route: Route, settings: StreamSettings, *, on_error: ErrorSink) -> None:
        self._route = route
        self._settings = settings
        self._on_error = on_error
        self.phase = Phase.HEADERS
        self.request_id = "-"
        self.log = RequestLog(log, {"request_id": self.request_id})
        self._chunks: list[bytes] = []
        self._size = 0
        self._whole_body_messages = False

    @property
    def failed(self) -> bool:
        return self.phase is Phase.FAILED

    def handle(self, message: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        """The responses to send for one message, in order (usually exactly one)."""
        if message.HasField("protocol_config"):
            self._whole_body_messages = message.protocol_config.request_body_mode in _WHOLE_BODY_MODES
        if self.phase is Phase.FAILED:
            return []
        kind = message.WhichOneof("request")
        if kind == "request_headers":
            return self._on_headers(message.request_headers)
        if kind == "request_body":
            return self._on_body(message.request_body)
        if kind == "request_trailers":
            return self._on_trailers()
        if kind == "response_headers":
            return [responses.response_headers_continue()]
        if kind == "response_body":
            return [responses.response_body_continue()]
        if kind == "response_trailers":
            return [responses.response_trailers_continue()]
        return []

    def _on_headers(self, headers: pb.HttpHeaders) -> list[pb.ProcessingResponse]:
        if self.phase is not Phase.HEADERS:
            return self._fail(Internal("request headers arrived twice on one stream"))
        self.request_id = (_header(headers, REQUEST_ID_HEADER) or str(uuid.uuid4()))[:_MAX_REQUEST_ID]
        self.log = RequestLog(log, {"request_id": self.request_id})
        if headers.end_of_stream:
            return self._decide(None)
        self.phase = Phase.BODY
        return [responses.request_headers_continue()]

    def _on_body(self, body: pb.HttpBody) -> list[pb.ProcessingResponse]:
        if self.phase is Phase.HEADERS:
            self.log.warning("request body before request headers")
            self.phase = Phase.BODY
        if self.phase is not Phase.BODY:
            return [responses.request_body_continue()]
        self._size += len(body.body)
        if self._size > self._settings.max_body_bytes:
            return self._fail(BodyTooLarge(f"request body exceeds {self._settings.max_body_bytes} bytes"))
        self._chunks.append(body.body)
        if body.end_of_stream or self._whole_body_messages:
            return self._decide(self._take_body())
        return []

    def _on_trailers(self) -> list[pb.ProcessingResponse]:
        if self.phase is not Phase.BODY:
            return [responses.request_trailers_continue()]
        # Trailers end the body: route with what arrived.
        answers = self._decide(self._take_body())
        if not self.failed:
            answers.append(responses.request_trailers_continue())
        return answers

    def _take_body(self) -> bytes:
        body = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks = []
        return body

    def _decide(self, body: bytes | None) -> list[pb.ProcessingResponse]:
        try:
            routing = self._route(body)
        except PickerError as exc:
            return self._fail(exc)
        except Exception:
            self.log.exception("routing failed")
            return self._fail(Internal("internal error"))
        self.phase = Phase.ROUTED
        settings = self._settings
        self.log.debug("model %r -> %r routed to %s", routing.model, routing.target, routing.endpoint)
        if routing.body is None:
            return [
                responses.request_headers_routed(
                    routing.endpoint,
                    destination_header=settings.destination_header,
                    metadata_namespace=settings.metadata_namespace,
                )
            ]
        return [
            responses.request_body_routed(
                routing.endpoint,
                routing.body,
                rewritten=routing.rewritten,
                destination_header=settings.destination_header,
                metadata_namespace=settings.metadata_namespace,
            )
        ]

    def _fail(self, error: PickerError) -> list[pb.ProcessingResponse]:
        self.phase = Phase.FAILED
        self._chunks = []
        self.log.log(
            _LOG_LEVELS.get(error.status, logging.INFO), "answering %d: %s", error.status, error.message
        )
        self._on_error(error)
        return [error_response(error)]


def _header(headers: pb.HttpHeaders, name: str) -> str | None:
    for entry in headers.headers.headers:
        if entry.key.lower() == name:
            return str(entry.raw_value.decode("utf-8", "replace") if entry.raw_value else entry.value)
    return None
