"""Which cluster rewrite rule decides a model (upstream's precedence)."""

from __future__ import annotations

import pytest

from pointsman_shared.cluster import ClusterObjects, ClusterRewrite, RewriteRule, RewriteTarget


def rw(name: str, created: str, *models: str) -> ClusterRewrite:
    rule = RewriteRule(models, (RewriteTarget(f"{name}-target", None),))
    return ClusterRewrite(name, "llm-d.ai/v1alpha2", 1, created, (rule,))


OLD, NEW = "2026-01-01T00:00:00Z", "2026-06-01T00:00:00Z"


@pytest.mark.parametrize(
    ("rewrites", "model", "decides"),
    [
        # an exact match beats a rule with no matches, however old that one is
        ([rw("generic", OLD), rw("exact", NEW, "m")], "m", "exact"),
        # among exact matches (and among generic rules) the oldest object wins
        ([rw("young", NEW, "m"), rw("old", OLD, "m")], "m", "old"),
        ([rw("young", NEW), rw("old", OLD)], "other", "old"),
        # the same age: the lower name
        ([rw("b", OLD, "m"), rw("a", OLD, "m")], "m", "a"),
        # a model no rule names: the generic rule, else none
        ([rw("exact", OLD, "m"), rw("generic", NEW)], "x", "generic"),
        ([rw("exact", OLD, "m")], "x", None),
        ([], "m", None),
    ],
)
def test_the_rule_that_decides_a_model(
    rewrites: list[ClusterRewrite], model: str, decides: str | None
) -> None:
    found = ClusterObjects(rewrites=tuple(rewrites)).rule_for(model)
    assert (found[0].name if found else None) == decides


def test_the_generic_rule_and_the_exact_models() -> None:
    objects = ClusterObjects(rewrites=(rw("exact", OLD, "m", "n"), rw("generic", NEW)))
    assert objects.exact_models() == {"m", "n"}
    generic = objects.generic_rule()
    assert generic is not None
    assert generic[0].name == "generic"
    assert ClusterObjects(rewrites=(rw("exact", OLD, "m"),)).generic_rule() is None
