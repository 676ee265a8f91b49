"""The ext_proc service on either server: :class:`RequestStream` per gRPC stream, counted the same way.

``native_methods`` plugs it into :class:`~pointsman_picker.h2grpc.server.
GrpcServer`; :class:`GrpcioServicer` into grpc.aio.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf.message import DecodeError

from pointsman_picker.extproc.response_chunk import response_body
from pointsman_picker.extproc.responses import RESPONSE_BODY_CONTINUE, serialized
from pointsman_picker.extproc.stream import (
    Clock,
    CompletionSink,
    DeferredSink,
    ErrorSink,
    Metadata,
    Phase,
    RequestStream,
    RouteRequest,
    StreamSettings,
    Tracer,
)
from pointsman_picker.h2grpc.calls import Method, ServerStream, Status
from pointsman_picker.routing import Routing

PROCESS_PATH = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
_CONTINUE = serialized(RESPONSE_BODY_CONTINUE)


class ExtProcService:
    def __init__(
        self,
        route: RouteRequest,
        settings: StreamSettings,
        *,
        on_error: ErrorSink,
        on_complete: CompletionSink,
        on_finish: Callable[[Routing], None],
        clock: Clock,
        on_response: Callable[[Routing], None] | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self._route = route
        self.tracer = tracer  # None: tracing is off, and no stream reads its call's metadata
        self.settings = settings  # swapped on a config reload; each stream keeps the one it began with
        self._on_error = on_error
        self._on_complete = on_complete
        self._on_finish = on_finish
        self._on_response = on_response
        self._clock = clock
        self.open_streams = 0
        # Streams the server cut short at shutdown: still open when the grace ran out.
        self.unfinished_streams = 0
        self._cut_after: float | None = None  # on the clock: when shutdown's grace runs out

    def open(self, metadata: Metadata = (), deferred: DeferredSink | None = None) -> RequestStream:
        """A stream; ``deferred`` sends the answers of a request held by flow control, later."""
        self.open_streams += 1
        return RequestStream(
            self._route,
            self.settings,
            on_error=self._on_error,
            on_complete=self._on_complete,
            on_response=self._on_response,
            clock=self._clock,
            deferred=deferred,
            tracer=self.tracer,
            metadata=metadata,
        )

    def shutting_down(self, grace: float) -> None:
        """Shutdown began: the server lets open streams end for ``grace`` seconds, then cancels the rest.

        A stream that ends after that was still open when the grace ran out, and counts as cut short. How
        a stream ends says nothing: Envoy resets most streams once their exchange is over (and any
        stream whose client went away), so ``cut_short`` is true for thousands of normal ends too.
        """
        self._cut_after = self._clock() + max(grace, 0.0)

    def close(self, stream: RequestStream, *, cut_short: bool) -> None:
        """``stream`` ended: ``cut_short`` when by a cancel or a reset, else by Envoy's half-close."""
        self.open_streams -= 1
        stream.abandon()
        stream.closed()
        if stream.routing is not None:
            self._on_finish(stream.routing)
        if self._cut_after is not None and self._clock() >= self._cut_after:
            self.unfinished_streams += 1
            stream.log.debug("stream cut short at shutdown, in phase %s", stream.phase.value)
        elif stream.phase is Phase.BODY and cut_short:
            stream.log.debug("stream reset before the request body was complete")


class GrpcioServicer(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, service: ExtProcService) -> None:
        self._service = service

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> None:
        later: asyncio.Queue[list[pb.ProcessingResponse]] = asyncio.Queue()
        service = self._service
        stream = service.open(
            context.invocation_metadata() or () if service.tracer is not None else (), later.put_nowait
        )
        try:
            # context.read()/write() rather than the request iterator and yield: grpc.aio's iterator
            # path wraps every message in extra tasks (measured: see docs/picker.md, "Speed").
            while (message := await context.read()) is not grpc.aio.EOF:
                for response in stream.handle(message):
                    await context.write(response)
                if stream.phase is Phase.QUEUED:
                    # Held: Envoy sends nothing more until it has the answer. A client that goes away
                    # cancels this task, and close() takes the request out of the queue.
                    for response in await later.get():
                        await context.write(response)
        finally:
            # grpc.aio ends the request iterator like a half-close when shutdown's grace runs out.
            self._service.close(stream, cut_short=context.cancelled())


class _ProcessCall:
    """One ext_proc stream on the native server."""

    __slots__ = ("_done", "_server_stream", "_service", "_stream")

    def __init__(self, service: ExtProcService, server_stream: ServerStream) -> None:
        self._service = service
        self._server_stream = server_stream
        self._stream = service.open(server_stream.metadata, self._send_later)
        self._done = False

    def message(self, payload: bytes) -> None:
        # A streamed response's chunks (one per token) skip the protobuf decode and are answered with
        # bytes serialized once.
        chunk = response_body(payload)
        if chunk is not None:
            answer = self._stream.response_chunk(*chunk)
            if answer is RESPONSE_BODY_CONTINUE:
                self._server_stream.send(_CONTINUE)  # the same bytes object each time: framed once
            elif answer is not None:
                self._server_stream.send(serialized(answer))
            return
        try:
            request = pb.ProcessingRequest.FromString(payload)
        except DecodeError:
            self._server_stream.finish(Status.INVALID_ARGUMENT, "not a ProcessingRequest")
            self._end(cut_short=True)
            return
        send = self._server_stream.send
        for response in self._stream.handle(request):
            send(serialized(response))

    def _send_later(self, answers: list[pb.ProcessingResponse]) -> None:
        if not self._done:
            send = self._server_stream.send
            for response in answers:
                send(response.SerializeToString())

    def half_closed(self) -> None:
        self._server_stream.finish()
        self._end(cut_short=False)

    def cancelled(self) -> None:
        self._end(cut_short=True)

    def _end(self, *, cut_short: bool) -> None:
        if not self._done:
            self._done = True
            self._service.close(self._stream, cut_short=cut_short)


def native_methods(service: ExtProcService) -> dict[str, Method]:
    """The ext_proc method for the native server (health's come from :mod:`pointsman_picker.health`)."""
    return {PROCESS_PATH: lambda server_stream: _ProcessCall(service, server_stream)}
