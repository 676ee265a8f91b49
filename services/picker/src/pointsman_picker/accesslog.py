"""Envoy's gRPC access log (``envoy.service.accesslog.v3.AccessLogService``): the response sizes and usage
tokens of requests whose body Envoy did not show the picker.

In the shipped mode (response body NONE) Envoy's Lua filter (``deploy/envoy/usage.lua``) reads the usage
as the body streams past and writes ``pointsman.usage``; the picker itself wrote ``pointsman.route``
(model, target) when it routed the request. Envoy sends each finished request's entry, batched, on one
long stream per worker, to any picker: the entry carries everything, so no picker keeps state for it.

:func:`logged_response` maps one entry (pure); :class:`AccessLogService` decodes a stream's messages,
bounds them and counts every entry by result; the two server adapters sit at the edge. Nothing an entry
or a message holds is ever an error to Envoy (it would stop sending until its next flush): what cannot
be read is counted and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2
from google.protobuf import struct_pb2
from google.protobuf.message import DecodeError

from pointsman_picker.extproc.responses import ROUTE_NAMESPACE  # written on the routed answer
from pointsman_picker.h2grpc.calls import Method, ServerStream
from pointsman_picker.routing import Usage

ACCESS_LOG_PATH = "/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs"
USAGE_NAMESPACE = "pointsman.usage"  # written by deploy/envoy/usage.lua
# Envoy sends a batch when its buffer (16 KB in the shipped bootstraps) fills or its timer fires, so a
# message is tens of KB at most; these bounds only stop a client that is not that Envoy.
MAX_MESSAGE_BYTES = 1024 * 1024
MAX_ENTRIES_PER_MESSAGE = 2000
MAX_LABEL_CHARS = 256
MAX_TOKENS = 1 << 31
# Entry results (the ``result`` label of pointsman_picker_access_log_entries).
RECORDED = "recorded"
UNROUTED = "unrouted"  # no pointsman.route: not routed by a picker, or its body was shown to one
MALFORMED = "malformed"
DROPPED = "dropped"  # past the per-message cap, or in a message too large or not decodable
_ANSWER: bytes = als_pb2.StreamAccessLogsResponse().SerializeToString()

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoggedResponse:
    """What the access log adds to a :class:`~pointsman_picker.routing.Completion` the ext_proc stream
    reported without its body (``response_bytes`` None): the body's size and its usage."""

    model: str
    target: str
    response_bytes: int
    usage: Usage | None


LoggedSink = Callable[[LoggedResponse], bool]  # False: not recorded (past the sink's own bounds)
ResultSink = Callable[[str, int], None]  # (result, entries)


def _label(fields: struct_pb2.Struct, key: str) -> str | None:
    value = fields.fields.get(key)
    if value is None or value.WhichOneof("kind") != "string_value":
        return None
    text = value.string_value
    return text if len(text) <= MAX_LABEL_CHARS else None


def _count(fields: struct_pb2.Struct, key: str) -> int | None:
    value = fields.fields.get(key)
    if value is None or value.WhichOneof("kind") != "number_value":
        return None
    number = value.number_value
    if not 0 <= number < MAX_TOKENS or number != int(number):
        return None
    return int(number)


def logged_response(entry: accesslog_pb2.HTTPAccessLogEntry) -> LoggedResponse | str:
    """The entry's model, target, body size and usage; else why not (:data:`UNROUTED`, :data:`MALFORMED`).

    Usage is optional (a stream whose client did not ask for it has none); when present, both counts
    must be whole numbers or the entry is malformed.
    """
    metadata = entry.common_properties.metadata.filter_metadata
    if ROUTE_NAMESPACE not in metadata:
        return UNROUTED
    route = metadata[ROUTE_NAMESPACE]
    model, target = _label(route, "model"), _label(route, "target")
    if model is None or target is None:
        return MALFORMED
    usage = None
    if USAGE_NAMESPACE in metadata:
        found = metadata[USAGE_NAMESPACE]
        prompt, completion = _count(found, "prompt_tokens"), _count(found, "completion_tokens")
        if prompt is None or completion is None:
            return MALFORMED
        usage = Usage(prompt, completion)
    return LoggedResponse(model, target, entry.response.response_body_bytes, usage)


class AccessLogService:
    """Reads a stream's messages: every entry is recorded (``on_logged``) or counted by why not
    (``on_result``). Calls still open at shutdown are ended (:meth:`shutting_down`): Envoy never ends its
    stream, and opens a new one with its next batch; one opened after that (before Envoy had the
    server's GOAWAY) is ended after its first message."""

    def __init__(self, *, on_logged: LoggedSink, on_result: ResultSink) -> None:
        self._on_logged = on_logged
        self._on_result = on_result
        self._enders: set[Callable[[], None]] = set()
        self.closing = False

    def message(self, payload: bytes) -> None:
        if len(payload) > MAX_MESSAGE_BYTES:
            self._on_result(DROPPED, 1)
            return
        try:
            message = als_pb2.StreamAccessLogsMessage.FromString(payload)
        except DecodeError:
            self._on_result(DROPPED, 1)
            return
        self.entries(message)

    def entries(self, message: als_pb2.StreamAccessLogsMessage) -> None:
        entries = message.http_logs.log_entry
        if len(entries) > MAX_ENTRIES_PER_MESSAGE:
            self._on_result(DROPPED, len(entries) - MAX_ENTRIES_PER_MESSAGE)
        counts = {RECORDED: 0, UNROUTED: 0, MALFORMED: 0, DROPPED: 0}
        for entry in entries[:MAX_ENTRIES_PER_MESSAGE]:
            found = logged_response(entry)
            if isinstance(found, str):
                counts[found] += 1
            else:
                counts[RECORDED if self._on_logged(found) else DROPPED] += 1
        for result, count in counts.items():
            if count:
                self._on_result(result, count)

    def opened(self, end: Callable[[], None]) -> None:
        self._enders.add(end)

    def closed(self, end: Callable[[], None]) -> None:
        self._enders.discard(end)

    @property
    def open_calls(self) -> int:
        return len(self._enders)

    def shutting_down(self) -> None:
        self.closing = True
        for end in list(self._enders):
            end()


class _AccessLogCall:
    """One access log stream on the native server."""

    __slots__ = ("_done", "_server_stream", "_service")

    def __init__(self, service: AccessLogService, server_stream: ServerStream) -> None:
        self._service = service
        self._server_stream = server_stream
        self._done = False
        service.opened(self.end)

    def message(self, payload: bytes) -> None:
        if not self._done:
            self._service.message(payload)
            if self._service.closing:
                self.end()

    def half_closed(self) -> None:
        self.end()

    def cancelled(self) -> None:
        self._done = True
        self._service.closed(self.end)

    def end(self) -> None:
        if not self._done:
            self._done = True
            self._service.closed(self.end)
            # StreamAccessLogs is client-streaming: its one (empty) answer, then OK.
            self._server_stream.send(_ANSWER)
            self._server_stream.finish()


def access_log_methods(service: AccessLogService) -> dict[str, Method]:
    return {ACCESS_LOG_PATH: lambda server_stream: _AccessLogCall(service, server_stream)}


class GrpcioAccessLogServicer:
    """The method on grpc.aio, registered with :meth:`handler`: messages come as bytes, so the service
    decodes them (and counts what does not decode) as on the native server."""

    def __init__(self, service: AccessLogService) -> None:
        self._service = service

    def handler(self) -> grpc.GenericRpcHandler:
        service, method = ACCESS_LOG_PATH.strip("/").split("/")
        return grpc.method_handlers_generic_handler(
            service,
            {
                method: grpc.stream_unary_rpc_method_handler(
                    self.stream_access_logs, response_serializer=lambda answer: answer
                )
            },
        )

    async def stream_access_logs(self, request_iterator: object, context: grpc.aio.ServicerContext) -> bytes:
        ended = asyncio.Event()
        self._service.opened(ended.set)
        try:
            while not ended.is_set():
                read = asyncio.ensure_future(context.read())
                stop = asyncio.ensure_future(ended.wait())
                await asyncio.wait((read, stop), return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                if not read.done():
                    read.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await read
                    break
                payload = read.result()
                if payload is grpc.aio.EOF:
                    break
                self._service.message(payload)
                if self._service.closing:
                    break
        finally:
            self._service.closed(ended.set)
        return _ANSWER
