"""Model resolution (spec §3): the name a client sends, and the objective it names, -> the model to
serve, its priority and whether it may be shed, and what decided it.

Two sources, chosen by ``picker.clusterObjects``: the config file (``models``: InferenceModels, their
weighted targets, criticality or priority; ``objectives``) and the cluster's InferenceModelRewrites and
InferenceObjectives (:class:`~pointsman_shared.cluster.ClusterObjects`, published by the collector).
``both`` uses both, the config winning on a clash: a model the config lists is resolved by the config
alone; an objective the config declares has the config's priority.

A model the config does not list is rewritten by the cluster rule that decides it (an exact match,
else a rule with no matches; the oldest object first), with the default priority. A model nothing
matches is served as asked when ``picker.passthroughUnknownModels`` is on (upstream v1). The
``x-gateway-inference-objective`` header names an InferenceObjective; its priority then decides (an
unknown name is the default objective, priority 0). A negative priority is sheddable.

Each :class:`Resolution` names what decided it, ``config/NAME`` or ``cluster/NAME``: the model entry or
rewrite (``rewrite``) and the objective (``objective``); empty when nothing did.

Pure: the randomness of the target draw comes from the caller's ``random.Random``.
"""

from __future__ import annotations

import dataclasses
import random
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Literal

from pointsman_shared.cluster import ClusterObjects, ClusterRewrite, RewriteRule
from pointsman_shared.config import InferenceModel, InferenceObjective

DEFAULT_PRIORITY = 0  # upstream's default objective

Sources = Literal["both", "cluster", "config"]


@dataclass(frozen=True, slots=True)
class Resolution:
    model: str  # what the client asked for
    target: str  # what the pod will be asked for
    critical: bool  # never shed
    priority: int = DEFAULT_PRIORITY
    configured: bool = True  # False: a model no entry or rule names (passed through, or a generic rule)
    rewrite: str = ""  # the model entry or rewrite that decided the target: config/NAME, cluster/NAME
    objective: str = ""  # the objective that set the priority: config/NAME, cluster/NAME


class ModelCatalog:
    """The models and objectives of the sources ``sources`` selects, each model's resolutions built
    once."""

    def __init__(
        self,
        models: Iterable[InferenceModel],
        objectives: Iterable[InferenceObjective] = (),
        *,
        passthrough: bool = False,
        cluster: ClusterObjects | None = None,
        sources: Sources = "both",
    ) -> None:
        if sources == "cluster":
            models, objectives = (), ()
        if sources == "config":
            cluster = None
        self._models: dict[str, _Targets] = {}
        self._priorities: dict[str, tuple[int, str]] = {}
        self._generic: _Targets | None = None
        if cluster is not None:
            for name in sorted(cluster.exact_models()):
                found = cluster.rule_for(name)
                assert found is not None
                self._models[name] = _Targets.of_rule(name, *found)
            generic = cluster.generic_rule()
            if generic is not None:
                self._generic = _Targets.of_rule("", *generic)
            for objective in cluster.objectives:
                self._priorities[objective.name] = (objective.priority, f"cluster/{objective.name}")
        for model in models:  # the config wins on a clash
            self._models[model.model_name] = _Targets.of_model(model)
        for configured in objectives:
            self._priorities[configured.name] = (configured.priority, f"config/{configured.name}")
        self._passthrough = passthrough

    def resolve(self, name: str, rng: random.Random, objective: str | None = None) -> Resolution | None:
        """``None`` when nothing resolves this name and unknown models are not passed through."""
        targets = self._models.get(name)
        if targets is not None:
            resolution = targets.draw(rng)
        elif self._generic is not None:
            resolution = self._generic.draw_for(name, rng)
        elif self._passthrough:
            resolution = Resolution(name, name, critical=True, configured=False)
        else:
            return None
        if objective is None:
            return resolution
        priority, decided = self._priorities.get(objective, (DEFAULT_PRIORITY, ""))
        return dataclasses.replace(resolution, critical=priority >= 0, priority=priority, objective=decided)


class _Targets:
    """One model's resolutions, one per target, and how to draw one: no targets, the model name itself;
    weights unset, uniform; else a weighted draw (all weights or none, checked before)."""

    __slots__ = ("_bounds", "_draw", "_resolutions")

    def __init__(self, resolutions: Sequence[Resolution], weights: Sequence[int | None], draw: bool) -> None:
        self._resolutions = tuple(resolutions)
        self._draw = draw
        # A draw below bound i and not below bound i - 1 picks target i.
        self._bounds = list(accumulate(w or 0 for w in weights)) if weights and None not in weights else None

    @classmethod
    def of_model(cls, model: InferenceModel) -> _Targets:
        targets = model.target_models
        names = [target.name for target in targets] or [model.model_name]
        # A model with a criticality and no priority: Critical ranks as the default objective, the
        # sheddable ones below it.
        priority = model.priority if model.priority is not None else (0 if model.critical else -1)
        decided = f"config/{model.model_name}"
        resolutions = [
            Resolution(model.model_name, name, model.critical, priority, rewrite=decided) for name in names
        ]
        return cls(resolutions, [target.weight for target in targets], bool(targets))

    @classmethod
    def of_rule(cls, model: str, rewrite: ClusterRewrite, rule: RewriteRule) -> _Targets:
        """A cluster rule's targets for ``model`` (``""``: a rule with no matches, for any model)."""
        decided = f"cluster/{rewrite.name}"
        resolutions = [
            Resolution(model, t.model, True, DEFAULT_PRIORITY, configured=bool(model), rewrite=decided)
            for t in rule.targets
        ]
        return cls(resolutions, [t.weight for t in rule.targets], True)

    def draw(self, rng: random.Random) -> Resolution:
        if self._bounds is not None:
            return self._resolutions[bisect_right(self._bounds, rng.randrange(self._bounds[-1]))]
        if self._draw:
            return self._resolutions[rng.randrange(len(self._resolutions))]
        return self._resolutions[0]

    def draw_for(self, model: str, rng: random.Random) -> Resolution:
        """A draw of a rule with no matches, for the model asked."""
        return dataclasses.replace(self.draw(rng), model=model)
