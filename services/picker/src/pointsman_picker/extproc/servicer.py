"""The thin grpc.aio ext_proc servicer: one :class:`RequestStream` per gRPC stream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from pointsman_picker.director import Routing
from pointsman_picker.extproc.stream import (
    Clock,
    CompletionSink,
    ErrorSink,
    Phase,
    RequestStream,
    Route,
    StreamSettings,
)


class ExtProcServicer(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(
        self,
        route: Route,
        settings: StreamSettings,
        *,
        on_error: ErrorSink,
        on_complete: CompletionSink,
        on_finish: Callable[[Routing], None],
        clock: Clock,
    ) -> None:
        self._route = route
        self.settings = settings  # swapped on a config reload; each stream keeps the one it began with
        self._on_error = on_error
        self._on_complete = on_complete
        self._on_finish = on_finish
        self._clock = clock
        self.open_streams = 0
        self.unfinished_streams = 0

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> None:
        stream = RequestStream(
            self._route,
            self.settings,
            on_error=self._on_error,
            on_complete=self._on_complete,
            clock=self._clock,
        )
        self.open_streams += 1
        try:
            # context.read()/write() rather than the request iterator and yield: grpc.aio's iterator
            # path wraps every message in extra tasks (measured: see docs/picker.md, "Speed").
            while (message := await context.read()) is not grpc.aio.EOF:
                for response in stream.handle(message):
                    await context.write(response)
        finally:
            self.open_streams -= 1
            if stream.routing is not None:
                self._on_finish(stream.routing)
            # A stream that ends while a request body is still due was cut short: Envoy reset it, or
            # shutdown's grace ran out (grpc.aio then ends the request iterator like a half-close).
            if stream.phase is Phase.BODY or context.cancelled():
                self.unfinished_streams += 1
                stream.log.debug("stream ended before the request was complete")
