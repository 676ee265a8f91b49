"""Model resolution (spec §3)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from pointsman_picker.resolution import ModelCatalog, Resolution
from pointsman_shared.cluster import (
    ClusterObjective,
    ClusterObjects,
    ClusterRewrite,
    RewriteRule,
    RewriteTarget,
)
from pointsman_shared.config import InferenceModel, InferenceObjective


def model(name: str, criticality: str | None = None, targets=()) -> InferenceModel:
    return InferenceModel.model_validate(
        {"modelName": name, "criticality": criticality, "targetModels": [dict(t) for t in targets]}
    )


def draws(m: InferenceModel, n: int = 10_000) -> Counter[str]:
    catalog, rng = ModelCatalog([m]), random.Random(7)
    return Counter(catalog.resolve(m.model_name, rng).target for _ in range(n))


@pytest.mark.parametrize(
    ("criticality", "critical"),
    [("Critical", True), ("Standard", False), ("Sheddable", False), (None, False)],
)
def test_only_critical_is_critical(criticality, critical):
    catalog = ModelCatalog([model("m", criticality)])
    # Critical ranks as the default objective (priority 0), the rest below it.
    assert catalog.resolve("m", random.Random(0)) == Resolution(
        "m", "m", critical, 0 if critical else -1, rewrite="config/m"
    )


@pytest.mark.parametrize(("priority", "critical"), [(-1, False), (0, True), (10, True)])
def test_an_inference_objective_is_sheddable_only_with_a_negative_priority(priority, critical):
    objective = InferenceModel.model_validate({"modelName": "m", "priority": priority})
    resolved = ModelCatalog([objective]).resolve("m", random.Random(0))
    assert resolved == Resolution("m", "m", critical, priority, rewrite="config/m")


def test_unknown_model_is_none_unless_passed_through():
    assert ModelCatalog([model("m")]).resolve("other", random.Random(0)) is None
    passed = ModelCatalog([model("m")], passthrough=True).resolve("other", random.Random(0))
    assert passed == Resolution("other", "other", critical=True, priority=0, configured=False)


OBJECTIVES = [
    InferenceObjective(name="batch", priority=-5),
    InferenceObjective(name="interactive", priority=10),
]


@pytest.mark.parametrize(
    ("asked", "objective", "critical", "priority"),
    [
        # the header's objective decides, for a configured model and a passed-through one alike
        ("m", "batch", False, -5),
        ("m", "interactive", True, 10),
        ("other", "batch", False, -5),
        # an objective nobody declared is the default one: priority 0, never shed
        ("m", "nobody", True, 0),
        ("other", "nobody", True, 0),
        # no header: the model's own criticality (Sheddable: below the default), or the default
        ("m", None, False, -1),
        ("other", None, True, 0),
    ],
)
def test_the_objective_header_sets_the_priority(asked, objective, critical, priority):
    catalog = ModelCatalog([model("m", "Sheddable", [{"name": "m-v1"}])], OBJECTIVES, passthrough=True)
    resolved = catalog.resolve(asked, random.Random(0), objective)
    assert (resolved.critical, resolved.priority) == (critical, priority)
    assert resolved.target == ("m-v1" if asked == "m" else asked)


def test_no_targets_serves_the_name_itself():
    assert draws(model("base"), 10) == Counter({"base": 10})


def test_unset_weights_draw_uniformly():
    counts = draws(model("m", targets=[{"name": "a"}, {"name": "b"}, {"name": "c"}]), 9000)
    assert set(counts) == {"a", "b", "c"}
    assert all(2700 < n < 3300 for n in counts.values())


def test_weights_draw_proportionally():
    counts = draws(model("m", targets=[{"name": "a", "weight": 90}, {"name": "b", "weight": 10}]))
    assert 8700 < counts["a"] < 9300
    assert counts["a"] + counts["b"] == 10_000


def test_a_single_weighted_target_always_wins():
    assert draws(model("m", targets=[{"name": "only", "weight": 5}]), 100) == Counter({"only": 100})


# --- with the cluster's objects (picker.clusterObjects) ------------------------------------------------

GIE = "inference.networking.x-k8s.io/v1alpha2"
CLUSTER = ClusterObjects(
    objectives=(ClusterObjective("batch", GIE, 1, -3), ClusterObjective("premium", GIE, 1, 10)),
    rewrites=(
        ClusterRewrite(
            "canary",
            GIE,
            1,
            "2026-01-01T00:00:00Z",
            (RewriteRule(("m", "cm"), (RewriteTarget("cm-v2", None),)),),
        ),
        ClusterRewrite(
            "catch-all", GIE, 1, "2026-02-01T00:00:00Z", (RewriteRule((), (RewriteTarget("base", None),)),)
        ),
    ),
)


@pytest.mark.parametrize(
    ("sources", "asked", "objective", "expected"),
    [
        # both: a model the config lists is the config's; an objective it declares has its priority
        ("both", "m", None, ("m-v1", -1, "config/m", "")),
        ("both", "m", "batch", ("m-v1", -5, "config/m", "config/batch")),
        ("both", "cm", "premium", ("cm-v2", 10, "cluster/canary", "cluster/premium")),
        # a model nothing names exactly: the rule with no matches (its model label bounded apart)
        ("both", "anything", None, ("base", 0, "cluster/catch-all", "")),
        ("both", "anything", "nobody", ("base", 0, "cluster/catch-all", "")),
        # cluster: the config is not used
        ("cluster", "m", "batch", ("cm-v2", -3, "cluster/canary", "cluster/batch")),
        ("cluster", "m", "interactive", ("cm-v2", 0, "cluster/canary", "")),
        # config: the cluster is not used
        ("config", "cm", "premium", ("cm", 0, "", "")),
        ("config", "m", "interactive", ("m-v1", 10, "config/m", "config/interactive")),
    ],
)
def test_the_sources_and_what_decided(sources, asked, objective, expected):
    catalog = ModelCatalog(
        [model("m", "Sheddable", [{"name": "m-v1"}])],
        OBJECTIVES,
        passthrough=True,
        cluster=CLUSTER,
        sources=sources,
    )
    resolved = catalog.resolve(asked, random.Random(0), objective)
    assert (resolved.target, resolved.priority, resolved.rewrite, resolved.objective) == expected
    assert resolved.critical is (resolved.priority >= 0)
    assert resolved.model == asked
    assert resolved.configured is (asked != "anything" and expected[2] != "")


def test_a_cluster_rewrite_draws_by_weight():
    weighted = ClusterRewrite(
        "split", GIE, 1, "", (RewriteRule(("m",), (RewriteTarget("a", 90), RewriteTarget("b", 10))),)
    )
    catalog, rng = ModelCatalog([], cluster=ClusterObjects(rewrites=(weighted,))), random.Random(7)
    counts = Counter(catalog.resolve("m", rng).target for _ in range(10_000))
    assert 8700 < counts["a"] < 9300
