"""The InferenceObjectives and InferenceModelRewrites of a pool, as the collector read them from the
cluster and publishes them beside the snapshot (``cluster_codec``); every picker resolves with them.

Frozen values, no I/O. Each object keeps its name, API version and ``metadata.generation``; an object the
collector refused is a :class:`Refused` with its reason, not an objective or a rewrite. Each watched
kind and API version has a :class:`WatchState` (watching, the CRD absent, the list forbidden, failing).

Which rewrite rule decides a model is upstream's rule (llm-d-router ``modelrewritestore.go``): a rule
naming the model exactly wins over a rule with no matches (which matches every model); among those,
the rule of the oldest object (``creationTimestamp``) wins, then the lower name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

OBJECTIVE: Final = "InferenceObjective"
REWRITE: Final = "InferenceModelRewrite"
Kind = Literal["InferenceObjective", "InferenceModelRewrite"]

# A watch's states: listing and watching; the CRD is not installed (404); the list is forbidden (403);
# any other failure (retried with backoff in every state but "watching").
WatchStatus = Literal["watching", "absent", "forbidden", "failing"]
WATCH_STATES: Final = ("watching", "absent", "forbidden", "failing")


@dataclass(frozen=True, slots=True)
class ClusterObjective:
    name: str
    api_version: str
    generation: int
    priority: int  # unset in the object: 0, as upstream reads it


@dataclass(frozen=True, slots=True)
class RewriteTarget:
    model: str
    weight: int | None  # all of a rule's targets have one, or none has


@dataclass(frozen=True, slots=True)
class RewriteRule:
    models: tuple[str, ...]  # the exact model names it matches; empty: every model
    targets: tuple[RewriteTarget, ...]


@dataclass(frozen=True, slots=True)
class ClusterRewrite:
    name: str
    api_version: str
    generation: int
    created: str  # metadata.creationTimestamp, RFC 3339 in UTC: ordered as text
    rules: tuple[RewriteRule, ...]


@dataclass(frozen=True, slots=True)
class Refused:
    kind: Kind
    name: str
    api_version: str
    generation: int
    reason: str


@dataclass(frozen=True, slots=True)
class WatchState:
    kind: Kind
    api_version: str
    status: WatchStatus
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ClusterObjects:
    """Everything the collector publishes of the cluster's objects, each list sorted by name."""

    objectives: tuple[ClusterObjective, ...] = ()
    rewrites: tuple[ClusterRewrite, ...] = ()
    refused: tuple[Refused, ...] = ()
    watches: tuple[WatchState, ...] = ()

    def rule_for(self, model: str) -> tuple[ClusterRewrite, RewriteRule] | None:
        """The rewrite rule that decides ``model``, and its object (see the module's docstring)."""
        exact: tuple[str, str, ClusterRewrite, RewriteRule] | None = None
        generic: tuple[str, str, ClusterRewrite, RewriteRule] | None = None
        for rewrite in self.rewrites:
            for rule in rewrite.rules:
                key = (rewrite.created, rewrite.name, rewrite, rule)
                if model in rule.models:
                    if exact is None or key[:2] < exact[:2]:
                        exact = key
                elif not rule.models and (generic is None or key[:2] < generic[:2]):
                    generic = key
        found = exact or generic
        return None if found is None else (found[2], found[3])

    def exact_models(self) -> frozenset[str]:
        """Every model name some rule matches exactly."""
        return frozenset(model for rw in self.rewrites for rule in rw.rules for model in rule.models)

    def generic_rule(self) -> tuple[ClusterRewrite, RewriteRule] | None:
        """The rule that decides a model no rule names (the oldest rule with no matches)."""
        return self.rule_for("")  # no rule names "": a match's value has at least one character
