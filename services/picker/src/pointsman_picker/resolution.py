"""Model resolution (spec §3): the name a client sends, and the objective it names, -> the model to
serve, its priority and whether it may be shed.

A model in the config's ``models`` is rewritten to one of its targets (weighted, as upstream's
InferenceModel and InferenceModelRewrite do) with its criticality or priority. A model not there is
served as asked when ``picker.passthroughUnknownModels`` is on (upstream v1). The
``x-gateway-inference-objective`` header names an InferenceObjective; its priority then decides (an
unknown name is the default objective, priority 0). A negative priority is sheddable.

Pure: the randomness of the target draw comes from the caller's ``random.Random``.
"""

from __future__ import annotations

import dataclasses
import random
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate

from pointsman_shared.config import InferenceModel, InferenceObjective

DEFAULT_PRIORITY = 0  # upstream's default objective


@dataclass(frozen=True, slots=True)
class Resolution:
    model: str  # what the client asked for
    target: str  # what the pod will be asked for
    critical: bool  # never shed
    priority: int = DEFAULT_PRIORITY
    configured: bool = True  # False: a model passed through as asked


class ModelCatalog:
    """The config's InferenceModels by ``modelName``, each with its resolutions built once, and the
    InferenceObjectives by name."""

    def __init__(
        self,
        models: Iterable[InferenceModel],
        objectives: Iterable[InferenceObjective] = (),
        *,
        passthrough: bool = False,
    ) -> None:
        self._models = {model.model_name: _Targets(model) for model in models}
        self._priorities = {objective.name: objective.priority for objective in objectives}
        self._passthrough = passthrough

    def resolve(self, name: str, rng: random.Random, objective: str | None = None) -> Resolution | None:
        """``None`` when no InferenceModel has this name and unknown models are not passed through."""
        targets = self._models.get(name)
        if targets is not None:
            resolution = targets.draw(rng)
        elif self._passthrough:
            resolution = Resolution(name, name, critical=True, configured=False)
        else:
            return None
        if objective is None:
            return resolution
        priority = self._priorities.get(objective, DEFAULT_PRIORITY)
        return dataclasses.replace(resolution, critical=priority >= 0, priority=priority)


class _Targets:
    """One model's resolutions, one per target, and how to draw one: no targets, the model name itself;
    weights unset, uniform; else a weighted draw (the config allows all weights or none)."""

    __slots__ = ("_bounds", "_draw", "_resolutions")

    def __init__(self, model: InferenceModel) -> None:
        targets = model.target_models
        names = [target.name for target in targets] or [model.model_name]
        # A model with a criticality and no priority: Critical ranks as the default objective, the
        # sheddable ones below it.
        priority = model.priority if model.priority is not None else (0 if model.critical else -1)
        self._resolutions = tuple(
            Resolution(model.model_name, name, model.critical, priority) for name in names
        )
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
