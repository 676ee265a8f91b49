"""The Lua filter (deploy/envoy/usage.lua) in a real Envoy 1.40, alone: a backend sends each response in
chunks cut where the test says (each chunk its own write, apart in time, so Envoy sees it apart), and an
in-test AccessLogService reads what Envoy's gRPC access log says the filter found.

The cuts are where a tail across chunks matters: inside the "usage" key, inside the object, between the
key and its value; plus a "usage":null before the real one, a JSON body, and bodies without usage."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from envoy.service.accesslog.v3 import als_pb2

from pointsman_devstack import envoy
from pointsman_devstack.ports import free_port
from pointsman_devstack.process import ManagedProcess
from pointsman_devstack.readiness import http_ok, wait_ready

pytestmark = pytest.mark.integration

USAGE = '"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}'
EVENT = 'data: {"choices":[{"text":"x"}],"usage":null}\n\n'
LAST = 'data: {"choices":[],' + USAGE + "}\n\ndata: [DONE]\n\n"


def cut(text: str, *marks: str) -> list[str]:
    """``text`` in chunks, each cut just before the first occurrence of a mark (after the one before)."""
    chunks, start = [], 0
    for mark in marks:
        at = text.index(mark, start)
        chunks.append(text[start:at])
        start = at
    return [*chunks, text[start:]]


SSE = "text/event-stream"
JSON = "application/json"
CASES: dict[str, tuple[str, list[str], dict[str, float] | None]] = {
    "sse-whole-events": (SSE, [EVENT] * 3 + [LAST], {"prompt_tokens": 12, "completion_tokens": 34}),
    "sse-key-split": (
        SSE,
        [EVENT, *cut(LAST, 'age":{"prompt')],
        {"prompt_tokens": 12, "completion_tokens": 34},
    ),
    "sse-object-split": (
        SSE,
        [EVENT, *cut(LAST, '2,"completion', '4,"total')],
        {"prompt_tokens": 12, "completion_tokens": 34},
    ),
    "sse-after-key": (SSE, cut(EVENT + LAST, ':{"prompt'), {"prompt_tokens": 12, "completion_tokens": 34}),
    "sse-byte-by-byte": (SSE, list(EVENT + LAST), {"prompt_tokens": 12, "completion_tokens": 34}),
    "sse-no-usage": (SSE, [EVENT.replace(',"usage":null', "")] * 3 + ["data: [DONE]\n\n"], None),
    "sse-usage-null": (SSE, [EVENT] * 3 + ["data: [DONE]\n\n"], None),
    "json": (
        JSON,
        ['{"id":"c","choices":[{"text":"hi"}],', USAGE + "}"],
        {"prompt_tokens": 12, "completion_tokens": 34},
    ),
    "json-one-chunk": (
        JSON,
        ['{"choices":[],' + USAGE + "}"],
        {"prompt_tokens": 12, "completion_tokens": 34},
    ),
    "text-ignored": ("text/plain", ["{" + USAGE + "}"], None),
}


class Backend(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        content_type, chunks, _ = CASES[self.path.strip("/")]
        self.send_response(200)
        self.send_header("content-type", content_type)
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for chunk in chunks:
            data = chunk.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
            time.sleep(0.002 if len(chunks) > 20 else 0.02)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Log:
    """An AccessLogService that keeps every entry's path and pointsman.usage."""

    def __init__(self) -> None:
        self.found: dict[str, dict[str, float] | None] = {}
        self.lock = threading.Lock()

    def stream(self, messages: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        for payload in messages:
            for entry in als_pb2.StreamAccessLogsMessage.FromString(payload).http_logs.log_entry:
                usage = entry.common_properties.metadata.filter_metadata.get("pointsman.usage")
                with self.lock:
                    self.found[entry.request.path.strip("/")] = (
                        None if usage is None else {k: v.number_value for k, v in usage.fields.items()}
                    )
        return als_pb2.StreamAccessLogsResponse().SerializeToString()


_TYPE = "type.googleapis.com/envoy.extensions."
_HCM = _TYPE + "filters.network.http_connection_manager.v3.HttpConnectionManager"
_GRPC_LOG = _TYPE + "access_loggers.grpc.v3.HttpGrpcAccessLogConfig"


def bootstrap(port: int, admin: int, backend: int, log: int) -> dict[str, Any]:
    def cluster(name: str, target: int, h2: bool = False) -> dict[str, Any]:
        found: dict[str, Any] = {
            "name": name,
            "connect_timeout": "1s",
            "load_assignment": {
                "cluster_name": name,
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address(target)}}]}],
            },
        }
        if h2:
            found["typed_extension_protocol_options"] = {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}},
                }
            }
        return found

    def address(target: int) -> dict[str, Any]:
        return {"socket_address": {"address": "127.0.0.1", "port_value": target}}

    hcm = {
        "@type": _HCM,
        "stat_prefix": "lua",
        "access_log": [
            {
                "name": "envoy.access_loggers.http_grpc",
                "typed_config": {
                    "@type": _GRPC_LOG,
                    "common_config": {
                        "log_name": "test",
                        "transport_api_version": "V3",
                        "grpc_service": {"envoy_grpc": {"cluster_name": "log"}},
                        "buffer_flush_interval": "0.05s",
                    },
                },
            }
        ],
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "backend"}}],
                }
            ]
        },
        "http_filters": [
            envoy.usage_filter(),
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            },
        ],
    }
    return {
        "admin": {"address": address(admin)},
        "static_resources": {
            "listeners": [
                {
                    "address": address(port),
                    "filter_chains": [
                        {
                            "filters": [
                                {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                            ]
                        }
                    ],
                }
            ],
            "clusters": [cluster("backend", backend), cluster("log", log, h2=True)],
        },
    }


@pytest.fixture(scope="module")
def lua_envoy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, Log]]:
    run_dir: Path = tmp_path_factory.mktemp("lua")
    backend = ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    log = Log()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "envoy.service.accesslog.v3.AccessLogService",
                {"StreamAccessLogs": grpc.stream_unary_rpc_method_handler(log.stream)},
            ),
        )
    )
    log_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    port, admin = free_port(), free_port()
    path = run_dir / "envoy.yaml"
    path.write_text(
        yaml.safe_dump(bootstrap(port, admin, backend.server_address[1], log_port)), encoding="utf-8"
    )
    argv = [envoy.find_envoy(), "-c", str(path), "--disable-hot-restart", "--concurrency", "1"]
    process = ManagedProcess("envoy-lua", argv, env={}, log_path=run_dir / "envoy.log")
    try:
        with httpx.Client(timeout=1.0) as probe:
            wait_ready(
                process, http_ok(probe, f"http://127.0.0.1:{admin}/ready"), timeout=30, what="admin /ready"
            )
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0) as client:
            yield client, log
    finally:
        process.stop(5.0)
        server.stop(0)
        backend.shutdown()
        backend.server_close()


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_filter_finds_the_last_usage_wherever_the_chunks_are_cut(
    lua_envoy: tuple[httpx.Client, Log], case: str
) -> None:
    client, log = lua_envoy
    _, chunks, expected = CASES[case]
    response = client.get(f"/{case}")
    # The body passes untouched.
    assert response.status_code == 200
    assert response.text == "".join(chunks)
    deadline = time.monotonic() + 10
    while case not in log.found and time.monotonic() < deadline:
        time.sleep(0.02)
    assert log.found[case] == expected
