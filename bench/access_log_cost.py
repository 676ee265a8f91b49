"""The picker's CPU per Envoy access log entry: what the shipped mode adds to each request in place of
the response body's chunks (docs/envoy.md, "Response side").

One ``StreamAccessLogsMessage`` as Envoy's gRPC access log sends it (entries of a completion, with the
``envoy.lb``, ``pointsman.route`` and ``pointsman.usage`` metadata, filled to the bootstraps' 16 KB
``buffer_size_bytes``) is fed to :class:`~pointsman_picker.accesslog.AccessLogService` over and over,
into real :class:`~pointsman_picker.metrics.PickerMetrics`: decode, map, record. The process's CPU per
entry is the result, with the load average, since it follows what else runs on the machine.

    .venv/bin/python bench/access_log_cost.py [--rounds 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import time

from envoy.service.accesslog.v3 import als_pb2
from prometheus_client import CollectorRegistry

from pointsman_picker.accesslog import AccessLogService
from pointsman_picker.metrics import PickerMetrics

BUFFER_BYTES = 16 * 1024  # the shipped bootstraps' buffer_size_bytes


def add_entry(message: als_pb2.StreamAccessLogsMessage) -> None:
    """An entry shaped like the one Envoy 1.40 logs for a completion through the gateway."""
    entry = message.http_logs.log_entry.add()
    common = entry.common_properties
    for field, host, port in (
        (common.downstream_remote_address, "127.0.0.1", 40000),
        (common.downstream_local_address, "127.0.0.1", 8080),
        (common.upstream_remote_address, "10.0.0.5", 8000),
    ):
        field.socket_address.address = host
        field.socket_address.port_value = port
    common.start_time.GetCurrentTime()
    for name in (
        "time_to_last_rx_byte",
        "time_to_first_upstream_tx_byte",
        "time_to_last_upstream_tx_byte",
        "time_to_first_upstream_rx_byte",
        "time_to_last_upstream_rx_byte",
        "time_to_first_downstream_tx_byte",
        "time_to_last_downstream_tx_byte",
    ):
        getattr(common, name).FromMilliseconds(12)
    common.upstream_cluster = "pointsman_pods"
    metadata = common.metadata.filter_metadata
    metadata["envoy.lb"].update({"x-gateway-destination-endpoint": "10.0.0.5:8000"})
    metadata["pointsman.route"].update({"model": "sql-lora", "target": "sql-lora"})
    metadata["pointsman.usage"].update({"prompt_tokens": 11, "completion_tokens": 200})
    entry.protocol_version = entry.HTTP11
    request = entry.request
    request.request_method = 3  # POST
    request.scheme = "http"
    request.authority = "127.0.0.1:8080"
    request.path = "/v1/completions"
    request.user_agent = "python-httpx/0.28"
    request.request_id = "6f1c2d3e-1111-2222-3333-444455556666"
    request.request_headers_bytes = 180
    request.request_body_bytes = 120
    response = entry.response
    response.response_code.value = 200
    response.response_headers_bytes = 120
    response.response_body_bytes = 30_000
    response.response_code_details = "via_upstream"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    message = als_pb2.StreamAccessLogsMessage()
    while message.ByteSize() < BUFFER_BYTES:
        add_entry(message)
    payload = message.SerializeToString()
    entries = len(message.http_logs.log_entry)
    metrics = PickerMetrics(CollectorRegistry())
    service = AccessLogService(on_logged=metrics.logged, on_result=metrics.access_log_result)
    for _ in range(50):  # warm: the label children exist, the code is hot
        service.message(payload)
    started = time.process_time()
    for _ in range(args.rounds):
        service.message(payload)
    cpu = time.process_time() - started
    print(
        json.dumps(
            {
                "entries_per_message": entries,
                "bytes_per_entry": len(payload) // entries,
                "cpu_us_per_entry": round(cpu / args.rounds / entries * 1e6, 2),
                "load_average": [round(x, 2) for x in os.getloadavg()],
            }
        )
    )


if __name__ == "__main__":
    main()
