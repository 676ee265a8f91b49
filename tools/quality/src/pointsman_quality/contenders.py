"""The contenders: Pointsman's decision path under several configs, and what users deploy instead.

Every contender is built fresh for each run from the scenario and a repeat index, as a fleet-driver router
that also hears when each of its requests ends.

- ``pointsman-*``, ``gie-default`` and ``prefix-only`` run the picker's Director
  (:mod:`pointsman_quality.picker_path`) with a Pointsman config: the scenario's ``pointsman``
  fragment, the models its traffic names, then the contender's own settings (``config/profiles/*.yaml``
  for the documented ones).
- ``<one of those>-2-pickers`` runs two Directors of that config, each request sent to one at random
  (as Envoy spreads them over picker replicas), each with its own prefix index;
  ``<...>-2-pickers-shared`` shares the two indexes with the delay of the Redis sync
  (:class:`~pointsman_quality.picker_path.TwoPickers`).
- ``random``, ``round-robin`` (a Kubernetes Service, Envoy ``ROUND_ROBIN``), ``least-request`` (Envoy
  ``LEAST_REQUEST``: the fewer in-flight of two random pods, counted by the router itself) and
  ``shortest-queue`` (the fewest waiting in the 50 ms snapshot: a naive metrics router).
- ``oracle-prefix``: not a router anyone could deploy but a bound (virtual time only): it reads every
  pod's engine at the moment of each request, its cached blocks and its queue, and sends the request
  where the most of its prefix is cached among the pods whose load is near the least loaded's.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import yaml

from pointsman_picker.scheduling.profiles import build_profile
from pointsman_picker.scheduling.registry import PluginError
from pointsman_quality.picker_path import DirectorRouter, TwoPickers
from pointsman_quality.scenario import Scenario, ScenarioError
from pointsman_quality.workload import ModelMix
from pointsman_shared.config import ConfigError, PointsmanConfig, parse_config
from pointsman_shared.snapshot import PodSnapshot
from pointsman_sim.engine import BLOCK_SIZE, Engine
from pointsman_sim.fleet import Hold, Placement, RoundRobin, TraceRequest
from pointsman_sim.prefix import spans_block_hashes


class Router(Protocol):
    def __call__(
        self, request: TraceRequest, pods: Sequence[PodSnapshot]
    ) -> int | Placement | Hold | None: ...

    def finished(self, request: TraceRequest) -> None: ...


@runtime_checkable
class EngineReader(Protocol):
    """A router that reads the engines themselves (a bound): the fleet driver hands them over first."""

    def attach(self, engines: Sequence[Engine]) -> None: ...


class OraclePrefixRouter:
    """``oracle-prefix``: among the pods whose load (waiting + running) is at most the least loaded
    pod's plus ``slack`` (4 requests, or a quarter more at high load), the one holding the longest
    cached prefix of the request's blocks, then the one with its adapter in a GPU slot, then the least
    loaded (the lowest index on ties). Reads the engines as they are, not a snapshot."""

    SLACK = 4

    def __init__(self) -> None:
        self._engines: Sequence[Engine] = ()

    def attach(self, engines: Sequence[Engine]) -> None:
        self._engines = engines

    def __call__(self, request: TraceRequest, pods: Sequence[PodSnapshot]) -> int:
        engines = self._engines
        if len(engines) != len(pods):
            raise RuntimeError("oracle-prefix reads the engines: run it through the fleet driver's on_start")
        hashes = spans_block_hashes(request.tokens, request.adapter, BLOCK_SIZE) if request.tokens else ()
        loads = [e.waiting_count + e.running_count for e in engines]
        least = min(loads)
        ceiling = least + max(self.SLACK, least // 4)
        best: tuple[int, bool, int] | None = None
        choice = 0
        for i, engine in enumerate(engines):
            if loads[i] > ceiling:
                continue
            key = (
                engine.cached_prefix_blocks(hashes) if hashes else 0,
                request.adapter is None or request.adapter in engine.gpu_adapters,
                -loads[i],
            )
            if best is None or key > best:
                best, choice = key, i
        return choice

    def finished(self, request: TraceRequest) -> None:
        pass


class RandomRouter:
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def __call__(self, request: TraceRequest, pods: Sequence[PodSnapshot]) -> int:
        return self._rng.randrange(len(pods))

    def finished(self, request: TraceRequest) -> None:
        pass


class RoundRobinRouter(RoundRobin):
    def finished(self, request: TraceRequest) -> None:
        pass


class LeastRequestRouter:
    """Envoy's ``LEAST_REQUEST`` with equal weights: of ``choices`` pods drawn at random, the one with
    the fewest requests this router has in flight there (the first drawn on a tie)."""

    def __init__(self, rng: random.Random, choices: int = 2) -> None:
        self._rng = rng
        self._choices = choices
        self._active: list[int] = []
        self._pod_of: dict[int, int] = {}

    def __call__(self, request: TraceRequest, pods: Sequence[PodSnapshot]) -> int:
        if len(self._active) != len(pods):
            self._active = [0] * len(pods)
        drawn = [self._rng.randrange(len(pods)) for _ in range(self._choices)]
        pod = min(drawn, key=lambda i: self._active[i])
        self._active[pod] += 1
        self._pod_of[id(request)] = pod
        return pod

    def finished(self, request: TraceRequest) -> None:
        pod = self._pod_of.pop(id(request), None)
        if pod is not None:
            self._active[pod] -= 1


class ShortestQueueRouter:
    """The pod with the fewest waiting, then running, requests in its snapshot; ties at random."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def __call__(self, request: TraceRequest, pods: Sequence[PodSnapshot]) -> int:
        best = min((pod.waiting, pod.running) for pod in pods)
        ties = [i for i, pod in enumerate(pods) if (pod.waiting, pod.running) == best]
        return ties[self._rng.randrange(len(ties))]

    def finished(self, request: TraceRequest) -> None:
        pass


BASELINES: dict[str, Callable[[random.Random], Router]] = {
    "random": RandomRouter,
    "round-robin": lambda rng: RoundRobinRouter(),
    "least-request": LeastRequestRouter,
    "shortest-queue": ShortestQueueRouter,
}

# Bounds, not routers: run only when a scenario names them (virtual time only).
BOUNDS: dict[str, Callable[[random.Random], Router]] = {"oracle-prefix": lambda rng: OraclePrefixRouter()}

# Pointsman contenders by name: inline settings, or a file of config/profiles/ (the documented ones).
POINTSMAN: dict[str, dict[str, Any] | str] = {
    "pointsman-423": {"picker": {"profile": "default"}},
    "pointsman-423-no-recent": {"picker": {"profile": "default", "countAssignments": False}},
    "pointsman-scorer": {"picker": {"profile": "scorer"}},
    "pointsman-scorer-no-recent": {"picker": {"profile": "scorer", "countAssignments": False}},
    "pointsman-best": "best.yaml",
    "gie-default": "gie-default.yaml",
    "prefix-only": "prefix-only.yaml",
}
TWO_PICKERS, SHARED = "-2-pickers", "-2-pickers-shared"
# Of these, two pickers with and without the shared prefix index (any Pointsman contender can be named so).
REPLICATED = ("gie-default", "pointsman-best")

NAMES = (*POINTSMAN, *BASELINES)  # a scenario's contenders when it names none
KNOWN = (
    *POINTSMAN,
    *(name + suffix for name in REPLICATED for suffix in (TWO_PICKERS, SHARED)),
    *BASELINES,
    *BOUNDS,
)


def replicas(name: str) -> tuple[str, int, bool]:
    """A contender name's Pointsman config, picker count and whether the prefix index is shared."""
    for suffix, shared in ((SHARED, True), (TWO_PICKERS, False)):
        base = name.removesuffix(suffix)
        if base != name and base in POINTSMAN:
            return base, 2, shared
    return name, 1, False


@dataclass(frozen=True, slots=True)
class Contender:
    name: str
    config: PointsmanConfig | None  # None for the baselines
    pickers: int = 1
    shared: bool = False  # two pickers share their prefix indexes

    def router(self, scenario: Scenario, repeat: int) -> Router:
        # Every contender draws from the same stream: a name must not decide the luck of its draws.
        rng = random.Random(f"{scenario.seed}:{repeat}:router")
        if self.config is None:
            return {**BASELINES, **BOUNDS}[self.name](rng)
        if self.pickers == 2:
            return TwoPickers(self.config, scenario.traffic.base_model, rng, shared=self.shared)
        return DirectorRouter(self.config, scenario.traffic.base_model, rng)


def models_for(scenario: Scenario) -> list[dict[str, Any]]:
    """An InferenceModel for every model name the traffic asks for, with the scenario's criticality."""
    names = [scenario.traffic.base_model, *ModelMix.of(scenario.traffic).adapters]
    return [{"modelName": name, "criticality": scenario.traffic.criticality} for name in names]


def merged(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` laid over ``base``: mappings merge key by key, anything else is replaced."""
    out = dict(base)
    for key, value in top.items():
        old = out.get(key)
        out[key] = merged(old, value) if isinstance(old, Mapping) and isinstance(value, Mapping) else value
    return out


def _read(path: Path, where: str) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ScenarioError(where, [(where, f"cannot read {path}: {exc}")]) from None
    if not isinstance(doc, dict):
        raise ScenarioError(where, [(where, f"{path} is not a mapping")])
    return doc


def contenders(scenario: Scenario, profiles_dir: Path, scenario_dir: Path | None = None) -> list[Contender]:
    """The scenario's contenders, each Pointsman config built and validated."""
    base: dict[str, Any] = {"models": models_for(scenario)}
    base = merged(base, scenario.pointsman)
    wanted: list[tuple[str, str, dict[str, Any] | None]] = []
    for i, name in enumerate(NAMES if scenario.contenders is None else scenario.contenders):
        where = f"contenders[{i}]"
        base_name = replicas(name)[0]
        if name in BASELINES or name in BOUNDS:
            wanted.append((where, name, None))
        elif base_name in POINTSMAN:
            spec = POINTSMAN[base_name]
            wanted.append((where, name, _read(profiles_dir / spec, where) if isinstance(spec, str) else spec))
        else:
            raise ScenarioError(where, [(where, f"unknown contender {name!r} (known: {', '.join(KNOWN)})")])
    for i, extra in enumerate(scenario.extra_contenders):
        where = f"extraContenders[{i}].config"
        if isinstance(extra.config, str):
            wanted.append((where, extra.name, _read((scenario_dir or Path.cwd()) / extra.config, where)))
        else:
            wanted.append((where, extra.name, extra.config))
    built = []
    for where, name, settings in wanted:
        if settings is None:
            built.append(Contender(name, None))
            continue
        try:
            config = parse_config(merged(base, settings), source=name)
            build_profile(config)  # the plugins and profiles too, before any run
        except ConfigError as exc:
            raise ScenarioError(where, [(f"{where} ({name}) {p}", m) for p, m in exc.problems]) from None
        except PluginError as exc:
            raise ScenarioError(where, [(f"{where} ({name}) {exc.path}", exc.message)]) from None
        _, pickers, shared = replicas(name)
        built.append(Contender(name, config, pickers, shared))
    names = [c.name for c in built]
    if len(set(names)) != len(names):
        raise ScenarioError("contenders", [("contenders", "two contenders have the same name")])
    return built
