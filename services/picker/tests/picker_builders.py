"""Tiny builders for the picker's tests: configs and ext_proc messages; pods and snapshots come from
:mod:`pointsman_testkit` (re-exported here for the picker's tests)."""

from __future__ import annotations

import random
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from pointsman_picker.context import RequestContext
from pointsman_picker.scheduling import CycleState, Drop, Pods, SchedulingRequest
from pointsman_picker.scheduling.backlog import PENDING_PREFILL, PROMPT_TOKENS
from pointsman_picker.scheduling.indexed import indexed
from pointsman_picker.scheduling.pickers import RandomPicker
from pointsman_picker.scheduling.prefix_cache import NO_MATCH, PREFIX_MATCH, PrefixMatch
from pointsman_picker.scheduling.profiles import DEFAULT, Profile
from pointsman_picker.scheduling.recent_targets import RECENT_TARGETS
from pointsman_picker.scheduling.tree import build_tree
from pointsman_shared.config import PointsmanConfig, SchedulingConfig, parse_config
from pointsman_shared.snapshot import PodSnapshot
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


def ctx(
    body: bytes | None,
    *,
    explain: bool = False,
    objective: str | None = None,
    headers: dict[str, str] | None = None,
    request_id: str = "req",
) -> RequestContext:
    """A request as the ext_proc stream hands it to the director."""
    return RequestContext(request_id, body, headers or {}, objective, explain)


def state(
    *,
    recent_targets: int | None = None,
    pending: dict[str, float] | None = None,
    prompt_tokens: int = 0,
    prefix: PrefixMatch = NO_MATCH,
) -> CycleState:
    """A request's cycle state with what the request plugins would have written into it (the prefix
    index's match always: none unless given)."""
    out = CycleState()
    if recent_targets is not None:
        out[RECENT_TARGETS] = recent_targets
    if pending is not None:
        out[PENDING_PREFILL] = pending
    out[PROMPT_TOKENS] = prompt_tokens
    out[PREFIX_MATCH] = prefix
    return out


def tree_profile(scheduling: SchedulingConfig | None = None) -> Profile:
    """The #423 tree, then a uniform pick (the built-in ``default`` profile)."""
    return Profile(DEFAULT, (build_tree(scheduling or SchedulingConfig()),), (), RandomPicker())


def run_profile(
    profile: Profile, request: SchedulingRequest, pods: Pods, rng: random.Random, trace: Any = None
) -> PodSnapshot | Drop:
    """``profile`` on ``pods`` (indexed, as the director passes them), with an empty cycle state."""
    return profile.schedule(request, indexed(tuple(pods)), CycleState(), rng, trace)


class Steps:
    """A profile trace that keeps each step: ``(kind, name, pods kept, scored or chosen from)``."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, str, int]] = []

    def __call__(self, name: str, kept: int) -> None:
        self.steps.append(("filter", name, kept))

    def scored(self, name: str, weight: float, scores: Any) -> None:
        self.steps.append(("scorer", name, len(scores)))

    def chose(self, name: str, pods: Pods, pod: PodSnapshot) -> None:
        self.steps.append(("picker", name, len(pods)))

    @property
    def filters(self) -> list[tuple[str, int]]:
        return [(name, kept) for kind, name, kept in self.steps if kind == "filter"]


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
