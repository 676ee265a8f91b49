"""Tiny builders for the picker's tests: configs and ext_proc messages; pods and snapshots come from
:mod:`pointsman_testkit` (re-exported here for the picker's tests)."""

from __future__ import annotations

from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from pointsman_shared.config import PointsmanConfig, parse_config
from pointsman_testkit import NOW as NOW
from pointsman_testkit import pod as pod
from pointsman_testkit import pool_pods as pool_pods
from pointsman_testkit import snapshot as snapshot

# The InferenceModels of upstream's end-to-end tests (spec §5 cases 6-10), plus a model without targets.
MODELS: list[dict[str, Any]] = [
    {"modelName": "my-model", "criticality": "Critical", "targetModels": [{"name": "my-model-12345"}]},
    {"modelName": "sql-lora", "criticality": "Critical", "targetModels": [{"name": "sql-lora-1fdg2"}]},
    {
        "modelName": "sql-lora-sheddable",
        "criticality": "Sheddable",
        "targetModels": [{"name": "sql-lora-1fdg3"}],
    },
    {"modelName": "plain", "criticality": "Critical"},
]


def config(**sections: Any) -> PointsmanConfig:
    """The upstream end-to-end tests' pool and models; a model they do not name is a 404, as at #423
    (``picker.passthroughUnknownModels`` off unless a ``picker`` section sets it)."""
    doc: dict[str, Any] = {"pool": {"name": "test-pool", "targetPort": 8000}, "models": MODELS}
    doc.update(sections)
    doc["picker"] = {"passthroughUnknownModels": False, **doc.get("picker", {})}
    return parse_config(doc)


def on_free_ports(cfg: PointsmanConfig, host: str = "127.0.0.1") -> PointsmanConfig:
    """The same config listening on port 0 everywhere (the config itself refuses port 0)."""
    picker = cfg.picker.model_copy(
        update={"listen": f"{host}:0", "health_listen": f"{host}:0", "metrics_listen": f"{host}:0"}
    )
    return cfg.model_copy(update={"picker": picker})


def headers(*pairs: tuple[str, str], end_of_stream: bool = False) -> pb.ProcessingRequest:
    header_map = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=key, raw_value=value.encode()) for key, value in pairs]
    )
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=header_map, end_of_stream=end_of_stream)
    )


def post_headers(*extra: tuple[str, str]) -> pb.ProcessingRequest:
    return headers((":method", "POST"), (":path", "/v1/completions"), *extra)


def body(data: bytes, *, end_of_stream: bool = True) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=end_of_stream))


def set_headers(response: pb.ProcessingResponse, phase: str = "request_body") -> dict[str, str]:
    common = getattr(response, phase).response
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


def metadata(response: pb.ProcessingResponse) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(response.dynamic_metadata)
