"""InferenceObjective and InferenceModelRewrite objects, as the API server returns them, read into the
published :class:`~pointsman_shared.cluster.ClusterObjects`. Pure.

The kinds live in two API groups: ``inference.networking.x-k8s.io/v1alpha2`` (GIE v1.0-v1.5; the
InferenceModelRewrite from v1.3) and ``llm-d.ai/v1alpha2`` (llm-d-router, where GIE v1.6 moved them).
Both have the same schema. An object belongs to the pool when its ``spec.poolRef`` names the pool's
name, group and kind (group and kind defaulted as the CRD defaults them), as upstream's reconcilers
decide.

An object of the pool that the CRD's schema would accept but that cannot be applied is refused with its
reason: a rewrite rule with weights on some targets only (the schema has no rule for it), a target or
match without a model name, a priority that is not an integer. The others still apply.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from pointsman_shared.cluster import (
    OBJECTIVE,
    REWRITE,
    ClusterObjective,
    ClusterObjects,
    ClusterRewrite,
    Kind,
    Refused,
    RewriteRule,
    RewriteTarget,
    WatchState,
)

GIE_GROUP_VERSION: Final = "inference.networking.x-k8s.io/v1alpha2"
LLM_D_GROUP_VERSION: Final = "llm-d.ai/v1alpha2"
# Every API version the release matrix serves these kinds in (tests/deploy/data/*-crds).
API_VERSIONS: Final = (GIE_GROUP_VERSION, LLM_D_GROUP_VERSION)
RESOURCES: Final[Mapping[Kind, str]] = {OBJECTIVE: "inferenceobjectives", REWRITE: "inferencemodelrewrites"}
# The CRDs' default of spec.poolRef.group and kind.
POOL_REF_GROUP: Final = "inference.networking.k8s.io"
POOL_REF_KIND: Final = "InferencePool"
MAX_TARGET_WEIGHT: Final = 1_000_000


@dataclass(frozen=True, slots=True)
class PoolRef:
    """The pool objects must name: its name and API group (its kind is InferencePool)."""

    name: str
    group: str = POOL_REF_GROUP


class Invalid(ValueError):
    """An object of the pool that cannot be applied; the message is the reason published."""


def belongs(obj: Mapping[str, Any], pool: PoolRef) -> bool:
    """Whether ``obj``'s ``spec.poolRef`` names ``pool`` (an object not shaped so: no)."""
    spec = obj.get("spec")
    ref = spec.get("poolRef") if isinstance(spec, Mapping) else None
    if not isinstance(ref, Mapping):
        return False
    return (
        ref.get("name") == pool.name
        and (ref.get("group") or POOL_REF_GROUP) == pool.group
        and (ref.get("kind") or POOL_REF_KIND) == POOL_REF_KIND
    )


def identity(obj: Mapping[str, Any]) -> tuple[str, int]:
    """The object's name and ``metadata.generation`` (0 when the server sent none)."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        return "", 0
    generation = metadata.get("generation")
    if isinstance(generation, bool) or not isinstance(generation, int):
        generation = 0
    return str(metadata.get("name", "")), generation


def objective(obj: Mapping[str, Any], api_version: str) -> ClusterObjective:
    """An InferenceObjective of the pool; raises :class:`Invalid`."""
    name, generation = identity(obj)
    priority = _spec(obj).get("priority", 0)
    if priority is None:
        priority = 0
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise Invalid(f"spec.priority {priority!r} is not an integer")
    if not -(2**31) <= priority < 2**31:
        raise Invalid(f"spec.priority {priority} is out of the int32 range")
    return ClusterObjective(name, api_version, generation, priority)


def rewrite(obj: Mapping[str, Any], api_version: str) -> ClusterRewrite:
    """An InferenceModelRewrite of the pool; raises :class:`Invalid`."""
    name, generation = identity(obj)
    rules = _spec(obj).get("rules")
    if not isinstance(rules, list):
        raise Invalid("spec.rules is not a list")
    metadata = obj.get("metadata")
    created = metadata.get("creationTimestamp") if isinstance(metadata, Mapping) else None
    return ClusterRewrite(
        name,
        api_version,
        generation,
        created if isinstance(created, str) else "",
        tuple(_rule(rule, f"spec.rules[{i}]") for i, rule in enumerate(rules)),
    )


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise Invalid("spec is not an object")
    return spec


def _rule(rule: Any, path: str) -> RewriteRule:
    if not isinstance(rule, Mapping):
        raise Invalid(f"{path} is not an object")
    matches = rule.get("matches") or []
    targets = rule.get("targets") or []
    if not isinstance(matches, list) or not isinstance(targets, list):
        raise Invalid(f"{path}: matches and targets must be lists")
    if not targets:
        raise Invalid(f"{path}.targets is empty")
    models: list[str] = []
    for i, match in enumerate(matches):
        model = match.get("model") if isinstance(match, Mapping) else None
        if not isinstance(model, Mapping):
            raise Invalid(f"{path}.matches[{i}] has no model")
        if (model.get("type") or "Exact") != "Exact":
            raise Invalid(f"{path}.matches[{i}].model.type {model.get('type')!r} is not supported (Exact)")
        value = model.get("value")
        if not isinstance(value, str) or not value:
            raise Invalid(f"{path}.matches[{i}].model.value is not a model name")
        if value not in models:
            models.append(value)
    read: list[RewriteTarget] = []
    for i, target in enumerate(targets):
        if not isinstance(target, Mapping):
            raise Invalid(f"{path}.targets[{i}] is not an object")
        model, weight = target.get("modelRewrite"), target.get("weight")
        if not isinstance(model, str) or not model:
            raise Invalid(f"{path}.targets[{i}].modelRewrite is not a model name")
        if weight is not None and (
            isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_TARGET_WEIGHT
        ):
            raise Invalid(f"{path}.targets[{i}].weight {weight!r} is not 1..{MAX_TARGET_WEIGHT}")
        read.append(RewriteTarget(model, weight))
    if len({t.weight is None for t in read}) > 1:
        raise Invalid(f"{path}: set a weight on every target or on none")
    return RewriteRule(tuple(models), tuple(read))


def read_objects(
    listed: Mapping[tuple[Kind, str], Iterable[Mapping[str, Any]]],
    watches: Iterable[WatchState],
    pool: PoolRef,
) -> ClusterObjects:
    """The pool's objects of every (kind, API version) listed, read; the invalid ones refused.

    An objective of the same name in two groups (an object being migrated to llm-d.ai): the one of the
    group listed first in :data:`API_VERSIONS` is used, the other refused as shadowed.
    """
    objectives: dict[str, ClusterObjective] = {}
    rewrites: dict[str, ClusterRewrite] = {}
    refused: list[Refused] = []
    for api_version in API_VERSIONS:
        _take(
            objectives,
            OBJECTIVE,
            api_version,
            listed.get((OBJECTIVE, api_version), ()),
            pool,
            objective,
            refused,
        )
        _take(rewrites, REWRITE, api_version, listed.get((REWRITE, api_version), ()), pool, rewrite, refused)
    return ClusterObjects(
        objectives=tuple(objectives[n] for n in sorted(objectives)),
        rewrites=tuple(rewrites[n] for n in sorted(rewrites)),
        refused=tuple(sorted(refused, key=lambda r: (r.kind, r.name, r.api_version))),
        watches=tuple(sorted(watches, key=lambda w: (w.kind, w.api_version))),
    )


T = TypeVar("T", ClusterObjective, ClusterRewrite)


def _take(
    table: dict[str, T],
    kind: Kind,
    api_version: str,
    objs: Iterable[Mapping[str, Any]],
    pool: PoolRef,
    read: Callable[[Mapping[str, Any], str], T],
    refused: list[Refused],
) -> None:
    for obj in objs:
        if not belongs(obj, pool):
            continue
        name, generation = identity(obj)
        if name in table:
            reason = f"shadowed by the {kind} of the same name in {table[name].api_version}"
            refused.append(Refused(kind, name, api_version, generation, reason))
            continue
        try:
            table[name] = read(obj, api_version)
        except Invalid as exc:
            refused.append(Refused(kind, name, api_version, generation, str(exc)))
