"""Model resolution (spec §3): the name a client sends -> the model to serve and whether it may be shed
(InferenceModel criticality, or InferenceObjective priority).

Pure: the randomness of the target draw comes from the caller's ``random.Random``.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate

from pointsman_shared.config import InferenceModel


@dataclass(frozen=True, slots=True)
class Resolution:
    model: str  # what the client asked for
    target: str  # what the pod will be asked for
    critical: bool


class ModelCatalog:
    """The config's InferenceModels by ``modelName``, each with its resolutions built once."""

    def __init__(self, models: Iterable[InferenceModel]) -> None:
        self._models = {model.model_name: _Targets(model) for model in models}

    def resolve(self, name: str, rng: random.Random) -> Resolution | None:
        """``None`` when no InferenceModel has this name."""
        targets = self._models.get(name)
        return None if targets is None else targets.draw(rng)


class _Targets:
    """One model's resolutions, one per target, and how to draw one: no targets, the model name itself;
    weights unset, uniform; else a weighted draw (the config allows all weights or none)."""

    __slots__ = ("_bounds", "_draw", "_resolutions")

    def __init__(self, model: InferenceModel) -> None:
        targets = model.target_models
        names = [target.name for target in targets] or [model.model_name]
        self._resolutions = tuple(Resolution(model.model_name, name, model.critical) for name in names)
        self._draw = bool(targets)
        weights = [target.weight for target in targets]
        # A draw below bound i and not below bound i - 1 picks target i.
        self._bounds = list(accumulate(w or 0 for w in weights)) if weights and None not in weights else None

    def draw(self, rng: random.Random) -> Resolution:
        if self._bounds is not None:
            return self._resolutions[bisect_right(self._bounds, rng.randrange(self._bounds[-1]))]
        if self._draw:
            return self._resolutions[rng.randrange(len(self._resolutions))]
        return self._resolutions[0]
