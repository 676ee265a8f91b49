"""InferenceObjectives and InferenceModelRewrites read into the published set (kubernetes/cluster_objects)."""

from __future__ import annotations

from typing import Any

import pytest

from pointsman_collector.kubernetes.cluster_objects import (
    GIE_GROUP_VERSION,
    LLM_D_GROUP_VERSION,
    PoolRef,
    belongs,
    read_objects,
)
from pointsman_shared.cluster import ClusterObjective, RewriteRule, RewriteTarget, WatchState

POOL = PoolRef("pool")


def obj(kind: str, name: str, spec: dict[str, Any], generation: int = 1) -> dict[str, Any]:
    return {
        "kind": kind,
        "metadata": {"name": name, "generation": generation, "creationTimestamp": "2026-12-01T00:00:00Z"},
        "spec": {"poolRef": {"name": "pool"}, **spec},
    }


def objective(name: str, **spec: Any) -> dict[str, Any]:
    return obj("InferenceObjective", name, spec)


def rewrite(name: str, *rules: dict[str, Any]) -> dict[str, Any]:
    return obj("InferenceModelRewrite", name, {"rules": list(rules)})


def rule(*targets: dict[str, Any], models: tuple[str, ...] = ("m",)) -> dict[str, Any]:
    return {"matches": [{"model": {"value": m}} for m in models], "targets": list(targets)}


@pytest.mark.parametrize(
    ("ref", "belongs_to_pool"),
    [
        ({"name": "pool"}, True),  # group and kind defaulted as the CRD defaults them
        ({"name": "pool", "group": "inference.networking.k8s.io", "kind": "InferencePool"}, True),
        ({"name": "other"}, False),
        ({"name": "pool", "group": "inference.networking.x-k8s.io"}, False),
        ({"name": "pool", "kind": "Service"}, False),
        (None, False),
    ],
)
def test_an_object_belongs_to_the_pool_its_pool_ref_names(ref: Any, belongs_to_pool: bool) -> None:
    assert belongs({"spec": {"poolRef": ref}}, POOL) is belongs_to_pool


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        (objective("o", priority="high"), "spec.priority 'high' is not an integer"),
        (objective("o", priority=2**31), "out of the int32 range"),
        (rewrite("r", rule({"modelRewrite": "a", "weight": 1}, {"modelRewrite": "b"})),
         "on every target or on none"),
        (rewrite("r", rule()), "spec.rules[0].targets is empty"),
        (rewrite("r", rule({"modelRewrite": ""})), "targets[0].modelRewrite is not a model name"),
        (rewrite("r", rule({"modelRewrite": "a", "weight": 0})), "targets[0].weight 0 is not 1..1000000"),
        (rewrite("r", {"matches": [{"model": {"value": "m", "type": "Prefix"}}],
                       "targets": [{"modelRewrite": "a"}]}),
         "type 'Prefix' is not supported"),
        (obj("InferenceModelRewrite", "r", {"rules": "all"}), "spec.rules is not a list"),
    ],
)  # fmt: skip
def test_an_invalid_object_is_refused_with_its_reason(item: dict[str, Any], reason: str) -> None:
    kind = item["kind"]
    good = (
        objective("fine", priority=1)
        if kind == "InferenceModelRewrite"
        else rewrite("fine", rule({"modelRewrite": "x"}))
    )
    read = read_objects(
        {(kind, GIE_GROUP_VERSION): [item], (good["kind"], GIE_GROUP_VERSION): [good]}, (), POOL
    )
    (refused,) = read.refused
    assert (refused.kind, refused.name, refused.generation) == (kind, item["metadata"]["name"], 1)
    assert reason in refused.reason
    assert len(read.objectives) + len(read.rewrites) == 1  # the rest still apply


def test_objects_are_read_in_both_groups_and_the_gie_group_shadows_llm_d() -> None:
    listed = {
        ("InferenceObjective", GIE_GROUP_VERSION): [objective("batch", priority=-1), objective("none")],
        ("InferenceObjective", LLM_D_GROUP_VERSION): [
            objective("batch", priority=9),
            objective("premium", priority=10),
        ],
        ("InferenceModelRewrite", LLM_D_GROUP_VERSION): [
            rewrite(
                "canary",
                rule(
                    {"modelRewrite": "a", "weight": 9}, {"modelRewrite": "b", "weight": 1}, models=("m", "m")
                ),
            )
        ],
    }
    watches = [WatchState("InferenceObjective", LLM_D_GROUP_VERSION, "watching")]
    read = read_objects(listed, watches, POOL)
    assert read.objectives == (
        ClusterObjective("batch", GIE_GROUP_VERSION, 1, -1),
        ClusterObjective("none", GIE_GROUP_VERSION, 1, 0),  # unset: 0, as upstream reads it
        ClusterObjective("premium", LLM_D_GROUP_VERSION, 1, 10),
    )
    ((canary),) = read.rewrites
    assert canary.rules == (RewriteRule(("m",), (RewriteTarget("a", 9), RewriteTarget("b", 1))),)
    (shadowed,) = read.refused
    assert (shadowed.name, shadowed.api_version) == ("batch", LLM_D_GROUP_VERSION)
    assert (
        "shadowed by the InferenceObjective of the same name in inference.networking.x-k8s.io"
        in shadowed.reason
    )
    assert read.watches == tuple(watches)


def test_objects_of_other_pools_are_not_read() -> None:
    other = objective("x", priority=1)
    other["spec"]["poolRef"]["name"] = "elsewhere"
    read = read_objects({("InferenceObjective", GIE_GROUP_VERSION): [other]}, (), POOL)
    assert read.objectives == read.refused == ()
