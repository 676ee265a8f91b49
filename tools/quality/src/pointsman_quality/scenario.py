"""A benchmark scenario: the fleet, the traffic, the load levels and the contenders, read from YAML.

Every field but ``name`` has a default; an invalid file is refused with the path of each bad key, as
the Pointsman config is. See ``bench/scenarios/README.md`` for the format.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from pointsman_shared.config import ConfigError, PositiveSeconds, parse_config, validation_problems
from pointsman_sim.engine import EngineConfig
from pointsman_sim.profiles import ENGINE_KEYS, ProfileError, load_profile, profile_names


class ScenarioError(ConfigError):
    """The scenario cannot be run; ``problems`` holds ``(path, message)`` pairs."""

    what = "scenario"


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True, strict=False
    )


# What targets may name: a run's figures (see pointsman_quality.runs.RunStats) and the capacity.
TARGET_METRICS = (
    "capacity",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_p90_s",
    "e2e_p90_s",
    "tokens_per_s",
    "adapter_loads",
    "rejected",
    "prefix_hit_rate",
)


class EngineOverrides(_Model):
    num_gpu_blocks: int | None = Field(default=None, ge=1)
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    max_model_len: int | None = Field(default=None, ge=1)
    max_loras: int | None = Field(default=None, ge=0)
    max_cpu_loras: int | None = Field(default=None, ge=0)

    def values(self) -> dict[str, Any]:
        return {key: value for key in ENGINE_KEYS if (value := getattr(self, key)) is not None}


class PodOverrides(EngineOverrides):
    pods: tuple[Annotated[int, Field(ge=0)], ...] = Field(min_length=1)
    """The indexes of the pods these values apply to."""


class FleetSpec(_Model):
    pods: int = Field(default=8, ge=1, le=1024)
    profile: str = "llama-3.1-8b-h100"
    """A simulator engine profile (``pointsman-sim --profile``'s choices)."""
    engine: EngineOverrides = EngineOverrides()
    per_pod: tuple[PodOverrides, ...] = ()

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, name: str) -> str:
        if name not in profile_names():
            raise ValueError(f"unknown engine profile {name!r} (known: {', '.join(profile_names())})")
        return name

    @field_validator("per_pod")
    @classmethod
    def _pods_exist(cls, groups: tuple[PodOverrides, ...], info: ValidationInfo) -> tuple[PodOverrides, ...]:
        pods = info.data.get("pods")
        for i, group in enumerate(groups):
            for pod in group.pods:
                if pods is not None and pod >= pods:
                    raise ValueError(f"[{i}].pods: pod {pod} does not exist (the fleet has {pods})")
        return groups


class AdapterGroup(_Model):
    """``count`` adapters named ``{prefix}-0`` .. sharing ``share`` of the traffic equally, or by a Zipf
    law of exponent ``zipf`` (the first most popular)."""

    prefix: str = Field(min_length=1)
    count: int = Field(ge=1, le=10_000)
    share: float = Field(gt=0)
    zipf: float | None = Field(default=None, gt=0)


class Arrivals(_Model):
    process: Literal["poisson", "on-off"] = "poisson"
    # on-off: bursts at peakFactor x the mean rate, silence between; a burst lasts onSeconds.
    peak_factor: float = Field(default=3.0, gt=1)
    on_seconds: PositiveSeconds = 5.0


class Lengths(_Model):
    dataset: Literal["sharegpt-like", "fixed"] = "sharegpt-like"
    prompt_tokens: int = Field(default=200, ge=1)  # fixed only
    output_tokens: int = Field(default=100, ge=1)  # fixed only


class SharedPrefix(_Model):
    """inference-perf's shared-prefix shape: ``numGroups`` system prompts of ``systemPromptLen`` tokens,
    each followed by one of ``numPromptsPerGroup`` questions of ``questionLen``; each request asks one
    of the ``numGroups x numPromptsPerGroup`` prompts, drawn uniformly, for ``outputLen`` tokens.
    ``perAdapter``: a group per model instead, the request's own (each adapter, and the base model, its
    own system prompt; ``numGroups`` is then unused)."""

    kind: Literal["shared-prefix"]
    num_groups: int = Field(default=1, ge=1, le=100_000)
    num_prompts_per_group: int = Field(default=1, ge=1, le=1_000_000)
    system_prompt_len: int = Field(ge=0)
    question_len: int = Field(ge=1)
    output_len: int = Field(ge=1)
    per_adapter: bool = False


class MultiTurn(_Model):
    """Conversations of ``turns`` turns that start as the arrival process says (at the scenario's rate
    over ``turns``, so requests arrive at the rate); turn k+1 comes a think time (exponential, mean
    ``thinkTime``) after turn k arrived, its prompt every earlier turn (system prompt, questions and
    answers) and a new question: a context that grows turn by turn."""

    kind: Literal["multi-turn"]
    turns: int = Field(ge=1, le=1000)
    system_prompt_len: int = Field(default=0, ge=0)
    question_len: int = Field(ge=1)
    output_len: int = Field(ge=1)
    think_time: PositiveSeconds = 10.0


class Traffic(_Model):
    base_model: str = "meta-llama/Llama-3.1-8B-Instruct"
    base_share: float = Field(default=0.0, ge=0)
    """The share of requests for the base model (no adapter), beside the adapter groups'."""
    adapters: tuple[AdapterGroup, ...] = ()
    criticality: Literal["Critical", "Standard", "Sheddable"] = "Critical"
    arrivals: Arrivals = Arrivals()
    lengths: Lengths = Lengths()
    prompts: Annotated[SharedPrefix | MultiTurn, Field(discriminator="kind")] | None = None
    """Prompts that share prefixes (their lengths replace ``lengths``); none: every prompt its own."""

    @model_validator(mode="after")
    def _some_traffic(self) -> Traffic:
        if self.base_share == 0 and not self.adapters:
            raise ValueError("no traffic: set baseShare or adapters")
        prefixes = [group.prefix for group in self.adapters]
        if len(set(prefixes)) != len(prefixes):
            raise ValueError("adapters: two groups have the same prefix")
        return self


class Capacity(_Model):
    """Capacity = the highest arrival rate whose p99 TTFT stays under ``p99TtftBelow``, found to within
    ``precision`` (a fraction) by doubling from ``startRps`` and then bisecting."""

    p99_ttft_below: PositiveSeconds = 2.0
    start_rps: float = Field(default=10.0, gt=0)
    precision: float = Field(default=0.05, gt=0, lt=1)


class LoadSpec(_Model):
    levels: tuple[Annotated[float, Field(gt=0)], ...] = (0.3, 0.5, 0.7, 0.85, 0.9, 0.95, 1.0, 1.1)
    """Fractions of the reference contender's capacity."""
    reference: str = "pointsman-423"
    duration: PositiveSeconds = 60.0
    """Seconds of arrivals in each run (every request then runs to its end)."""
    repeats: int = Field(default=1, ge=1, le=20)
    """Samples of the traffic per run, their requests pooled into one set of figures."""
    capacity: Capacity = Capacity()


class Variant(_Model):
    """The same scenario again with other engine values (e.g. ``max_loras`` 3 beside 4)."""

    name: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9-]*$")
    engine: EngineOverrides = EngineOverrides()


class ContenderSpec(_Model):
    """A Pointsman config of the scenario's own, run as a contender (``config``: a path, relative to
    the scenario file, or the config inline)."""

    name: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9-]*$")
    config: str | dict[str, Any]


class Target(_Model):
    """A claim the report checks: ``contender``'s ``metric`` at the levels in ``levels`` (inclusive
    bounds) is at most ``atMost`` (or at least ``atLeast``) times ``than``'s (``others``: the best
    other contender's), or the lowest (``best: lowest``) or highest of every contender's. The
    ``capacity`` metric is checked once, not per level."""

    contender: str = Field(min_length=1)
    metric: str
    than: str | None = None
    at_most: float | None = Field(default=None, gt=0)
    at_least: float | None = Field(default=None, gt=0)
    best: Literal["lowest", "highest"] | None = None
    levels: tuple[float, float] = (0.0, math.inf)

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, metric: str) -> str:
        if metric not in TARGET_METRICS:
            raise ValueError(f"unknown metric {metric!r} (known: {', '.join(TARGET_METRICS)})")
        return metric

    @model_validator(mode="after")
    def _one_comparison(self) -> Target:
        relative = self.than is not None and (self.at_most is None) != (self.at_least is None)
        if relative == (self.best is not None):
            raise ValueError("give `than` with one of atMost / atLeast, or `best`")
        return self

    def covers(self, level: float) -> bool:
        """Whether the target is checked at this load level (bounds inclusive, to float noise)."""
        low, high = self.levels
        return self.metric != "capacity" and low - 1e-9 <= level <= high + 1e-9


class Quick(_Model):
    """What ``QUICK=1`` runs instead: fewer levels, shorter runs, the first variant only."""

    levels: tuple[Annotated[float, Field(gt=0)], ...] = (0.5, 0.9)
    duration: PositiveSeconds = 30.0
    repeats: int = Field(default=1, ge=1, le=20)
    contenders: tuple[str, ...] | None = None


class Scenario(_Model):
    name: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str = ""
    seed: int = 1
    fleet: FleetSpec = FleetSpec()
    variants: tuple[Variant, ...] = ()
    traffic: Traffic
    load: LoadSpec = LoadSpec()
    contenders: tuple[str, ...] | None = None
    """Built-in contender names (``pointsman-quality --list-contenders``); default: all of them."""
    extra_contenders: tuple[ContenderSpec, ...] = ()
    pointsman: dict[str, Any] = Field(default_factory=dict)
    """A Pointsman config fragment laid under every Pointsman contender's own (models, scheduling
    thresholds, picker settings)."""
    quick: Quick = Quick()
    targets: tuple[Target, ...] = ()
    summary_variant: str | None = None
    """Write this variant's results (``""`` for a scenario without variants) to
    ``quality-summary.json`` too."""

    @field_validator("pointsman")
    @classmethod
    def _valid_fragment(cls, fragment: dict[str, Any]) -> dict[str, Any]:
        try:
            parse_config(fragment, source="pointsman")
        except ConfigError as exc:
            path, message = exc.problems[0]
            raise ValueError(f"{path}: {message}") from None
        return fragment

    @field_validator("variants")
    @classmethod
    def _unique_variants(cls, variants: tuple[Variant, ...]) -> tuple[Variant, ...]:
        names = [variant.name for variant in variants]
        if len(set(names)) != len(names):
            raise ValueError("two variants have the same name")
        return variants

    @field_validator("summary_variant")
    @classmethod
    def _known_variant(cls, name: str | None, info: ValidationInfo) -> str | None:
        names = [variant.name for variant in info.data.get("variants", ())] or [""]
        if name is not None and name not in names:
            raise ValueError(f"no variant {name!r} (have: {', '.join(map(repr, names))})")
        return name


def parse_scenario(doc: Any, *, source: str = "<scenario>") -> Scenario:
    if not isinstance(doc, dict):
        raise ScenarioError(source, [("", "the document must be a mapping")])
    try:
        return Scenario.model_validate(doc)
    except ValidationError as exc:
        raise ScenarioError(source, validation_problems(exc)) from None


def load_scenario(path: str | Path) -> Scenario:
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(source, [("", f"cannot read: {exc}")]) from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(source, [("", f"not valid YAML: {exc}")]) from None
    return parse_scenario(doc, source=source)


def engine_configs(scenario: Scenario, variant: Variant | None = None) -> list[EngineConfig]:
    """One engine config per pod: the profile, the fleet's values, the variant's, then each pod's."""
    try:
        base = load_profile(scenario.fleet.profile).engine
    except ProfileError as exc:  # the validator checked the name; a broken profile file is a bug
        raise ScenarioError("fleet.profile", [("fleet.profile", str(exc))]) from None
    common = {**scenario.fleet.engine.values(), **(variant.engine.values() if variant else {})}
    configs = []
    for pod in range(scenario.fleet.pods):
        values = dict(common)
        for group in scenario.fleet.per_pod:
            if pod in group.pods:
                values.update(group.values())
        try:
            configs.append(dataclasses.replace(base, **values))
        except ValueError as exc:
            where = f"variants[{variant.name}].engine" if variant else "fleet.engine"
            raise ScenarioError(where, [(where, f"pod {pod}: {exc}")]) from None
    return configs
