"""The per-stream state machine of one ext_proc stream (one HTTP request), apart from gRPC.

    HEADERS --headers, end_of_stream--> route without a body --> ROUTED
    HEADERS --headers--> BODY --chunks ... end_of_stream--> route --> ROUTED --response...--> DONE
    route --held by flow control--> QUEUED --answer later--> ROUTED (or FAILED)
    any error (400/404/413/429/500/503) --> FAILED (an ImmediateResponse was sent)
    GET /v1/models with configured models --> ANSWERED (the picker lists them itself)

Body chunks accumulate until ``end_of_stream`` (or trailers, or the one message of a BUFFERED body),
capped at ``max_body_bytes`` (413). How the decision is answered depends on the body mode Envoy
announces in ``protocol_config``:

- BUFFERED: headers answered at once; the body answer carries the route, Content-Length and the body.
- STREAMED: headers answered at once; every chunk's answer is held until the last, then all go out in
  order: earlier chunks cleared when the body is rewritten, the last one carrying route and body.
  (Envoy 1.40 picks the upstream as soon as the headers are answered in this mode, so a body that
  arrives after its headers cannot steer the route: use BUFFERED or FULL_DUPLEX_STREAMED.)
- STREAMED with ``send_body_without_waiting_for_header_response``: Envoy sends the chunks without
  waiting for the header answer, so that answer is held until the body is complete and carries the
  route (and Content-Length); then each chunk's answer, earlier ones cleared when the body is
  rewritten and the last one replaced by the new body.
- FULL_DUPLEX_STREAMED: nothing is answered until the body is complete; then the header answer
  (route, Content-Length), then the body in chunks of at most 62,000 bytes.

A request that flow control holds gets no answer yet: the stream asks Envoy to wait for it (one
``override_message_timeout`` response, the band's time limit plus a second, capped by
``flowControl.maxMessageTimeout``) and answers through the ``deferred`` sink when the controller
answers. A stream closed while QUEUED cancels its place in the queue (:meth:`RequestStream.abandon`).

When Envoy also sends the response, it is counted (status, sizes, duration, usage tokens) and passed
through untouched; the routing goes to the ``on_response`` sink when the response headers come (flow
control measures each pod's wait with it), and :class:`Completion` to the ``on_complete`` sink when it
ends: at the body's end, or, when Envoy shows the response headers but not the body, when the stream
ends (Envoy holds it open until the response is over).
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import duration_pb2

from pointsman_picker.context import NO_HEADERS, RequestContext
from pointsman_picker.errors import BodyTooLarge, Internal, PickerError
from pointsman_picker.extproc import responses
from pointsman_picker.extproc.usage import UsageScanner
from pointsman_picker.routing import Completion, Routing

REQUEST_ID_HEADER = "x-request-id"
MODELS_PATH = "/v1/models"
_MODE = processing_mode_pb2.ProcessingMode
_WHOLE_BODY_MODES = frozenset({_MODE.BUFFERED, _MODE.BUFFERED_PARTIAL})
_FULL_DUPLEX = _MODE.FULL_DUPLEX_STREAMED
_EVENT_STREAM = "text/event-stream"

# Load and availability answers (429, 503) can come by the thousand: metrics count them, DEBUG logs them.
_LOG_LEVELS = {429: logging.DEBUG, 503: logging.DEBUG, 500: logging.WARNING}
_MAX_REQUEST_ID = 128


class Deferred(Protocol):
    """A request held for later (flow control's ``Waiting``): the stream sets ``answer``, which is
    called once with the routing or the error; ``cancel`` gives up its place."""

    answer: Callable[[Routing | PickerError], None] | None
    ttl: float

    def cancel(self) -> None: ...


RouteRequest = Callable[[RequestContext], "Routing | Deferred"]
DeferredSink = Callable[[list[pb.ProcessingResponse]], None]
# Envoy's own margin past the queue time limit: the picker answers the expiry itself, first.
_TIMEOUT_MARGIN = 1.0
ErrorSink = Callable[[PickerError], None]
Clock = Callable[[], float]


CompletionSink = Callable[[Completion], None]
ResponseSink = Callable[[Routing], None]
Metadata = Iterable[tuple[bytes | str, bytes | str]]


class DecisionSpan(Protocol):
    """What the stream tells a request's span (:class:`pointsman_picker.tracing.RouteSpan`)."""

    def routed(self, routing: Routing) -> None: ...

    def failed(self, error: PickerError) -> None: ...


class Tracer(Protocol):
    """Starts a request's span, or ``None`` when it is not sampled."""

    def start(
        self, request_id: str, headers: Mapping[str, str], metadata: Metadata
    ) -> DecisionSpan | None: ...


log = logging.getLogger("pointsman_picker.stream")


class Phase(enum.Enum):
    HEADERS = "headers"
    BODY = "body"
    QUEUED = "queued"  # held by flow control: the answer comes later
    ROUTED = "routed"
    DONE = "done"  # the response ended too
    FAILED = "failed"
    ANSWERED = "answered"  # the picker answered the request itself


@dataclass(frozen=True, slots=True)
class StreamSettings:
    max_body_bytes: int
    destination_header: str
    metadata_namespace: str
    explain_header: str | None = None  # lower case, as Envoy sends header names
    objective_header: str = "x-gateway-inference-objective"
    # The answer to GET /v1/models: the model names clients send (None: a pod answers, as for any GET).
    models_listing: bytes | None = None
    # The longest message timeout a held request asks Envoy for (flowControl.maxMessageTimeout).
    max_message_timeout: float = 60.0


class RequestLog(logging.LoggerAdapter[logging.Logger]):
    """Puts the stream's request id on every line."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        return f"[{(self.extra or {}).get('request_id', '-')}] {msg}", kwargs


_NO_ID_LOG = RequestLog(log, {"request_id": "-"})


class RequestStream:
    def __init__(
        self,
        route: RouteRequest,
        settings: StreamSettings,
        *,
        on_error: ErrorSink,
        on_complete: CompletionSink | None = None,
        on_response: ResponseSink | None = None,
        clock: Clock | None = None,
        deferred: DeferredSink | None = None,
        tracer: Tracer | None = None,
        metadata: Metadata = (),
    ) -> None:
        """``metadata`` is the gRPC call's (read only by ``tracer``, for the trace context)."""
        self._route = route
        self._deferred = deferred
        self._waiting: Deferred | None = None
        self._held_chunks = 1
        self._span: DecisionSpan | None = None
        self._tracer = tracer
        self._metadata = metadata
        self._settings = settings
        self._on_error = on_error
        self._on_complete = on_complete
        self._on_response = on_response
        self._clock = clock
        self.phase = Phase.HEADERS
        self.request_id = "-"
        self.log = _NO_ID_LOG  # until the request headers name the request
        self._chunks: list[bytes] = []
        self._size = 0
        self._body_mode: int = _MODE.NONE
        self._response_body_mode: int = _MODE.NONE
        self._headers_wait = False  # the header answer waits for the whole body (and carries the route)
        self._started = 0.0
        self.routing: Routing | None = None
        self._status = 0
        self._response_bytes = 0
        self._usage: UsageScanner | None = None
        self._body_declined = False  # the response headers answer asked Envoy for no body
        self._explain = False
        self._headers: Mapping[str, str] = NO_HEADERS

    @property
    def failed(self) -> bool:
        return self.phase is Phase.FAILED

    def handle(self, message: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        """The responses to send for one message, in order (none while a streamed body accumulates)."""
        if message.HasField("protocol_config"):
            config = message.protocol_config
            self._body_mode = config.request_body_mode
            self._response_body_mode = config.response_body_mode
            # Where Envoy sends the body without waiting for the header answer, that answer carries
            # the route, so it waits for the whole body.
            self._headers_wait = self._body_mode == _FULL_DUPLEX or (
                self._body_mode == _MODE.STREAMED and config.send_body_without_waiting_for_header_response
            )
        if self.phase is Phase.FAILED or self.phase is Phase.ANSWERED or self.phase is Phase.QUEUED:
            return []
        kind = message.WhichOneof("request")
        if kind == "response_body":  # first: a streamed response sends one per token
            body = message.response_body
            answer = self.response_chunk(body.body, body.end_of_stream)
            return [answer] if answer is not None else []
        if kind == "request_headers":
            return self._on_headers(message.request_headers)
        if kind == "request_body":
            return self._on_body(message.request_body)
        if kind == "request_trailers":
            return self._on_trailers()
        if kind == "response_headers":
            return self._on_response_headers(message.response_headers)
        if kind == "response_trailers":
            self._complete()
            return [responses.response_trailers_continue()]
        return []

    def response_chunk(self, chunk: bytes, end_of_stream: bool) -> pb.ProcessingResponse | None:
        """The answer to one response body chunk (None: no answer), for :meth:`handle` and for the
        native server, which reads the chunk straight off the wire (``response_chunk.py``)."""
        phase = self.phase
        if phase is Phase.FAILED or phase is Phase.ANSWERED or phase is Phase.QUEUED:
            return None
        self._response_bytes += len(chunk)
        usage = self._usage
        if usage is not None:
            usage.feed(chunk)
        if end_of_stream:
            self._complete()
        if self._response_body_mode == _FULL_DUPLEX:
            return responses.response_body_echo(chunk, end_of_stream)
        return responses.RESPONSE_BODY_CONTINUE

    def _on_headers(self, headers: pb.HttpHeaders) -> list[pb.ProcessingResponse]:
        if self.phase is not Phase.HEADERS:
            return self._fail(Internal("request headers arrived twice on one stream"))
        if self._clock is not None:
            self._started = self._clock()
        self._headers = found = header_map(headers)
        self.request_id = (found.get(REQUEST_ID_HEADER) or str(uuid.uuid4()))[:_MAX_REQUEST_ID]
        self.log = RequestLog(log, {"request_id": self.request_id})
        explain_header = self._settings.explain_header
        self._explain = explain_header is not None and explain_header in found
        if headers.end_of_stream:
            listing = self._settings.models_listing
            if listing is not None and _is_models_list(found):
                self.phase = Phase.ANSWERED
                return [responses.immediate(200, listing, details="pointsman_models")]
            return self._decide(None)
        self.phase = Phase.BODY
        if self._headers_wait:
            return []  # the header answer carries the route, so it waits for the whole body
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
        if body.end_of_stream or self._body_mode in _WHOLE_BODY_MODES:
            return self._decide_body()
        return []

    def _on_trailers(self) -> list[pb.ProcessingResponse]:
        if self.phase is not Phase.BODY:
            return [responses.request_trailers_continue()]
        # Trailers end the body: route with what arrived.
        answers = self._decide_body()
        if not self.failed:
            answers.append(responses.request_trailers_continue())
        return answers

    def _decide_body(self) -> list[pb.ProcessingResponse]:
        chunks = len(self._chunks)
        body = self._chunks[0] if chunks == 1 else b"".join(self._chunks)
        self._chunks = []
        return self._decide(body, chunks)

    def _decide(self, body: bytes | None, chunks: int = 1) -> list[pb.ProcessingResponse]:
        span = None
        if self._tracer is not None:
            span = self._tracer.start(self.request_id, self._headers, self._metadata)
        try:
            result = self._route(
                RequestContext(
                    self.request_id,
                    body,
                    self._headers,
                    self._headers.get(self._settings.objective_header),
                    self._explain or span is not None,  # a traced decision records its path
                )
            )
        except PickerError as exc:
            if span is not None:
                span.failed(exc)
            return self._fail(exc)
        except Exception:
            self.log.exception("routing failed")
            error = Internal("internal error")
            if span is not None:
                span.failed(error)
            return self._fail(error)
        if not isinstance(result, Routing):
            self._span = span  # ends with the answer
            return self._hold(result, chunks)
        if span is not None:
            span.routed(result)
        return self._routed(result, chunks)

    def _hold(self, waiting: Deferred, chunks: int) -> list[pb.ProcessingResponse]:
        if self._deferred is None:
            waiting.cancel()
            return self._fail(Internal("a held request on a stream that cannot answer later"))
        self.phase = Phase.QUEUED
        self._waiting = waiting
        self._held_chunks = chunks
        waiting.answer = self._answered
        self.log.debug("held by flow control")
        timeout = min(waiting.ttl + _TIMEOUT_MARGIN, self._settings.max_message_timeout)
        extend = duration_pb2.Duration()
        extend.FromNanoseconds(int(timeout * 1e9))
        return [pb.ProcessingResponse(override_message_timeout=extend)]

    def _answered(self, result: Routing | PickerError) -> None:
        """Flow control's answer for the held request: out through the deferred sink."""
        if self.phase is not Phase.QUEUED or self._deferred is None:
            return
        self._waiting = None
        span, self._span = self._span, None
        if isinstance(result, PickerError):
            if span is not None:
                span.failed(result)
            answers = self._fail(result)
        else:
            if span is not None:
                span.routed(result)
            answers = self._routed(result, self._held_chunks)
        self._deferred(answers)

    def abandon(self) -> None:
        """The stream ended: a held request leaves the queue unanswered."""
        waiting = self._waiting
        if waiting is not None:
            self._waiting = None
            self.phase = Phase.FAILED
            waiting.cancel()

    def _routed(self, routing: Routing, chunks: int) -> list[pb.ProcessingResponse]:
        answers = self._route_answers(routing, chunks)
        if self._response_body_mode == _MODE.NONE:
            # The body will not be shown: Envoy's access log brings its size and tokens, labelled by this
            # (on the answer that carries the destination).
            carrier = answers[0] if self._headers_wait else answers[-1]
            responses.with_route_metadata(carrier, routing.model, routing.target)
        return answers

    def _route_answers(self, routing: Routing, chunks: int) -> list[pb.ProcessingResponse]:
        self.phase = Phase.ROUTED
        self.routing = routing
        settings = self._settings
        self.log.debug(
            "model %r -> %r routed to %s [%s]",
            routing.model,
            routing.target,
            routing.endpoint,
            routing.explain,
        )
        if routing.body is None:
            return [
                responses.request_headers_routed(
                    routing.endpoint,
                    destination_header=settings.destination_header,
                    metadata_namespace=settings.metadata_namespace,
                )
            ]
        # STREAMED: one answer per chunk, in order. Earlier chunks are dropped when the last answer
        # carries a rewritten body; else they pass as they are.
        earlier = responses.request_body_cleared if routing.rewritten else responses.request_body_continue
        if self._headers_wait:
            # The body came without waiting for the header answer (FULL_DUPLEX_STREAMED, or STREAMED
            # with send_body_without_waiting_for_header_response): that held answer routes.
            headers = responses.request_headers_routed(
                routing.endpoint,
                destination_header=settings.destination_header,
                metadata_namespace=settings.metadata_namespace,
                content_length=len(routing.body),
            )
            if self._body_mode == _FULL_DUPLEX:
                return [headers, *responses.request_body_streamed(routing.body)]
            last = responses.request_body_replaced(routing.body) if routing.rewritten else earlier()
            return [headers, *(earlier() for _ in range(chunks - 1)), last]
        return [
            *(earlier() for _ in range(chunks - 1)),
            responses.request_body_routed(
                routing.endpoint,
                routing.body,
                rewritten=routing.rewritten,
                destination_header=settings.destination_header,
                metadata_namespace=settings.metadata_namespace,
            ),
        ]

    def _on_response_headers(self, headers: pb.HttpHeaders) -> list[pb.ProcessingResponse]:
        found = header_map(headers)
        status = found.get(":status", "")
        # At most three ASCII digits: str.isdigit() also takes "²", which int() refuses.
        self._status = int(status) if len(status) <= 3 and status.isascii() and status.isdigit() else 0
        content_type = found.get("content-type", "")
        self._usage = UsageScanner(
            event_stream=content_type.startswith(_EVENT_STREAM), max_bytes=self._settings.max_body_bytes
        )
        routing = self.routing
        if self._on_response is not None and routing is not None and self.phase is Phase.ROUTED:
            self._on_response(routing)
        if headers.end_of_stream:
            self._complete()
        if self._explain and routing is not None and self._settings.explain_header:
            return [responses.response_headers_with(self._settings.explain_header, routing.explain)]
        if (
            self._usage.event_stream
            and self._response_body_mode == _MODE.STREAMED
            and not headers.end_of_stream
            and not _asks_for_usage(routing)
        ):
            # No usage will come: ask Envoy (allow_mode_override) to show no more of this response, so
            # its tokens cost no round trip each. Whether Envoy does is not told: if chunks come, they
            # are counted as ever; if not, the stream's end is the response's (closed()).
            self._body_declined = True
            return [responses.RESPONSE_HEADERS_NO_BODY]
        return [responses.response_headers_continue()]

    def closed(self) -> None:
        """The stream ended. With response headers shown and the body not (response body mode NONE),
        Envoy keeps the stream open until the response is over: that is its end."""
        not_shown = self._response_body_mode == _MODE.NONE or (
            self._body_declined and not self._response_bytes
        )
        if self._status and not_shown:
            self._complete(body_shown=False)

    def _complete(self, *, body_shown: bool = True) -> None:
        """Report the finished exchange once (the response ended: body, trailers or header-only)."""
        routing = self.routing
        if self.phase is not Phase.ROUTED or routing is None:
            return
        self.phase = Phase.DONE
        if self._on_complete is None:
            return
        usage = self._usage.finish() if self._usage is not None else None
        duration = self._clock() - self._started if self._clock is not None else 0.0
        self._on_complete(
            Completion(
                model=routing.model,
                target=routing.target,
                priority=routing.priority,
                status=self._status,
                duration=duration,
                request_bytes=len(routing.body) if routing.body is not None else 0,
                response_bytes=self._response_bytes if body_shown else None,
                usage=usage,
            )
        )

    def _fail(self, error: PickerError) -> list[pb.ProcessingResponse]:
        self.phase = Phase.FAILED
        self._chunks = []
        self.log.log(
            _LOG_LEVELS.get(error.status, logging.INFO),
            "answering %d: %s%s",
            error.status,
            error.message,
            f" [{error.explain}]" if error.explain else "",
        )
        self._on_error(error)
        return [responses.error_response(error, self._settings.explain_header if self._explain else None)]


def _asks_for_usage(routing: Routing | None) -> bool:
    """Whether the request may have asked for usage in its stream (``stream_options.include_usage``):
    a substring test, so a mention anywhere counts (then the body is shown as ever)."""
    return routing is None or routing.body is None or b"include_usage" in routing.body


def _is_models_list(headers: Mapping[str, str]) -> bool:
    path = headers.get(":path", "").split("?", 1)[0].rstrip("/")
    return path == MODELS_PATH and headers.get(":method") == "GET"


def header_map(headers: pb.HttpHeaders) -> dict[str, str]:
    """The headers by lower-case name, the first of each name (Envoy sends names in lower case)."""
    found: dict[str, str] = {}
    for entry in headers.headers.headers:
        name = entry.key.lower()
        if name not in found:
            raw = entry.raw_value
            found[name] = raw.decode("utf-8", "replace") if raw else entry.value
    return found
