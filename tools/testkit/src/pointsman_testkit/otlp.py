"""An OTLP trace receiver for tests: OTLP/gRPC (``TraceService/Export``) and OTLP/HTTP
(``POST /v1/traces``, protobuf) on free loopback ports, decoding with opentelemetry-proto, keeping
every span it was sent.

    with OtlpReceiver() as receiver:
        ...  # point tracing at receiver.grpc_endpoint or receiver.http_endpoint
        spans = receiver.wait_for(lambda spans: len(spans) >= 3)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1 import trace_pb2

SPAN_KINDS = {
    trace_pb2.Span.SPAN_KIND_INTERNAL: "internal",
    trace_pb2.Span.SPAN_KIND_SERVER: "server",
    trace_pb2.Span.SPAN_KIND_CLIENT: "client",
    trace_pb2.Span.SPAN_KIND_PRODUCER: "producer",
    trace_pb2.Span.SPAN_KIND_CONSUMER: "consumer",
}


@dataclass(frozen=True)
class ReceivedSpan:
    service: str  # the resource's service.name
    name: str
    kind: str  # server, client, internal, ...
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root span
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any]
    protocol: str  # grpc or http, how it came


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


def decode(request: trace_service_pb2.ExportTraceServiceRequest, protocol: str) -> list[ReceivedSpan]:
    """Every span of an export request, with its service's name."""
    spans = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        service=service,
                        name=span.name,
                        kind=SPAN_KINDS.get(span.kind, "unspecified"),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes={kv.key: _value(kv.value) for kv in span.attributes},
                        protocol=protocol,
                    )
                )
    return spans


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self._receiver._add(decode(request, "grpc"))
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """Use as a context manager; :meth:`close` stops both servers (a receiver gone away)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._lock = threading.Condition()
        self._spans: list[ReceivedSpan] = []
        self.requests = 0
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), self._grpc)  # type: ignore[no-untyped-call]
        self.grpc_port = self._grpc.add_insecure_port(f"{host}:0")
        self._http = ThreadingHTTPServer((host, 0), _http_handler(self))
        self.http_port = self._http.server_address[1]
        self.host = host
        self._http_thread = threading.Thread(target=self._http.serve_forever, name="otlp-http", daemon=True)
        self._closed = False

    @property
    def grpc_endpoint(self) -> str:
        return f"http://{self.host}:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://{self.host}:{self.http_port}/v1/traces"

    def start(self) -> OtlpReceiver:
        self._grpc.start()
        self._http_thread.start()
        return self

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._grpc.stop(None)
        self._http.shutdown()
        self._http.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()

    def wait_for(
        self, done: Callable[[list[ReceivedSpan]], bool], *, within: float = 20.0
    ) -> list[ReceivedSpan]:
        """The spans once ``done(spans)`` holds; AssertionError with what arrived after ``within`` s."""
        deadline = time.monotonic() + within
        with self._lock:
            while not done(list(self._spans)):
                left = deadline - time.monotonic()
                if left <= 0:
                    names = [(s.service, s.name) for s in self._spans]
                    raise AssertionError(f"the spans never matched within {within} s; got {names}")
                self._lock.wait(left)
            return list(self._spans)

    def _add(self, spans: list[ReceivedSpan]) -> None:
        with self._lock:
            self.requests += 1
            self._spans.extend(spans)
            self._lock.notify_all()


def _http_handler(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length)
            if self.path != "/v1/traces" or "protobuf" not in (self.headers.get("content-type") or ""):
                self.send_response(404 if self.path != "/v1/traces" else 415)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            receiver._add(decode(trace_service_pb2.ExportTraceServiceRequest.FromString(body), "http"))
            answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def main(argv: list[str] | None = None) -> int:
    """``python -m pointsman_testkit.otlp``: a receiver in a process of its own (bench/picker.py's
    tracing runs), printing its ports, then on SIGTERM or SIGINT the spans it received."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(description="An OTLP trace receiver that counts what it gets.")
    parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with OtlpReceiver() as receiver:
        print(f"grpc {receiver.grpc_port} http {receiver.http_port}", flush=True)
        stop.wait()
        print(f"spans {len(receiver.spans())}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
