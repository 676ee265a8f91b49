"""Model resolution (spec §3): the name a client sends -> the model to serve and whether it may be shed
(InferenceModel criticality, or InferenceObjective priority).

Pure: the randomness of the target draw comes from the caller's ``random.Random``.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from pointsman_shared.config import InferenceModel


@dataclass(frozen=True, slots=True)
class Resolution:
    model: str  # what the client asked for
    target: str  # what the pod will be asked for
    critical: bool


class ModelCatalog:
    """The config's InferenceModels by ``modelName``."""

    def __init__(self, models: Iterable[InferenceModel]) -> None:
        self._models = {model.model_name: model for model in models}

    def resolve(self, name: str, rng: random.Random) -> Resolution | None:
        """``None`` when no InferenceModel has this name."""
        model = self._models.get(name)
        if model is None:
            return None
        return Resolution(model=name, target=draw_target(model, rng), critical=model.critical)


def draw_target(model: InferenceModel, rng: random.Random) -> str:
    """No targets: the model name itself; weights unset: uniform; else a weighted draw."""
    targets = model.target_models
    if not targets:
        return model.model_name
    weights = [target.weight for target in targets]
    if any(weight is None for weight in weights):  # the config allows all weights or none
        return targets[rng.randrange(len(targets))].name
    draw = rng.randrange(sum(weight or 0 for weight in weights))
    for target in targets:
        weight = target.weight or 0
        if draw < weight:
            return target.name
        draw -= weight
    raise AssertionError("unreachable: the draw is below the sum of the weights")
