"""Model resolution (spec §3)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from pointsman_picker.resolution import ModelCatalog, Resolution
from pointsman_shared.config import InferenceModel


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
    assert catalog.resolve("m", random.Random(0)) == Resolution("m", "m", critical)


@pytest.mark.parametrize(("priority", "critical"), [(-1, False), (0, True), (10, True)])
def test_an_inference_objective_is_sheddable_only_with_a_negative_priority(priority, critical):
    objective = InferenceModel.model_validate({"modelName": "m", "priority": priority})
    assert ModelCatalog([objective]).resolve("m", random.Random(0)) == Resolution("m", "m", critical)


def test_unknown_model_is_none():
    assert ModelCatalog([model("m")]).resolve("other", random.Random(0)) is None


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
