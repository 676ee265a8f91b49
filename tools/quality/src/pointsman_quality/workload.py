"""A scenario's traffic as an arrival trace for the fleet driver, at any mean rate.

The i-th request has the same lengths and model at every rate (they come from their own random
stream), and its arrival is the same point of one unit-rate sample scaled to the rate: runs at
different rates differ only in how fast the same requests arrive.
"""

from __future__ import annotations

import random
import zlib
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate

from pointsman_quality.scenario import MultiTurn, Scenario, SharedPrefix, Traffic
from pointsman_sim.fleet import TraceRequest
from pointsman_sim.prefix import Span
from pointsman_sim.traces import SHAREGPT_OUTPUT, SHAREGPT_PROMPT, lognormal


@dataclass(frozen=True, slots=True)
class ModelMix:
    """The model names requests ask for (``None``: the base model) and their shares of the traffic."""

    names: tuple[str | None, ...]
    weights: tuple[float, ...]

    @classmethod
    def of(cls, traffic: Traffic) -> ModelMix:
        names: list[str | None] = []
        weights: list[float] = []
        if traffic.base_share:
            names.append(None)
            weights.append(traffic.base_share)
        for group in traffic.adapters:
            if group.zipf is None:
                split = [1.0] * group.count
            else:
                split = [1.0 / (k + 1) ** group.zipf for k in range(group.count)]
            total = sum(split)
            names.extend(f"{group.prefix}-{k}" for k in range(group.count))
            weights.extend(group.share * w / total for w in split)
        return cls(tuple(names), tuple(weights))

    @property
    def adapters(self) -> tuple[str, ...]:
        return tuple(name for name in self.names if name is not None)

    def drawer(self) -> _Draw:
        return _Draw(self.names, list(accumulate(self.weights)))


class _Draw:
    __slots__ = ("_bounds", "_names")

    def __init__(self, names: tuple[str | None, ...], bounds: list[float]) -> None:
        self._names = names
        self._bounds = bounds

    def __call__(self, rng: random.Random) -> str | None:
        i = bisect_right(self._bounds, rng.random() * self._bounds[-1])
        return self._names[min(i, len(self._names) - 1)]


def arrivals(scenario: Scenario, rate: float, duration: float, stream: str) -> list[float]:
    """Arrival times over ``duration`` seconds at a mean of ``rate`` per second: one sample of a
    unit-rate process (drawn from ``stream``) scaled to ``rate``, so that at a higher rate the same
    arrivals come sooner and more follow. Runs at two rates differ only in the load, never in the
    luck of the draw; a capacity search can then read a rate's verdict as the load's."""
    spec = scenario.traffic.arrivals
    if spec.process == "poisson":
        return _poisson(random.Random(stream), rate, 0.0, duration)
    # on-off: Poisson at peak x rate during each burst, then silence, so the mean stays `rate`; each
    # burst draws from a stream of its own, so it holds the same arrivals at every rate.
    peak = rate * spec.peak_factor
    period = spec.on_seconds * spec.peak_factor
    times: list[float] = []
    burst = 0
    while (start := burst * period) < duration:
        end = min(start + spec.on_seconds, duration)
        times += _poisson(random.Random(f"{stream}:{burst}"), peak, start, end)
        burst += 1
    return times


def _poisson(rng: random.Random, rate: float, start: float, end: float) -> list[float]:
    """Poisson arrivals at ``rate`` in ``[start, end)``: the unit-rate sample's points over ``rate``."""
    times = []
    unit = rng.expovariate(1.0)
    while (now := start + unit / rate) < end:
        times.append(now)
        unit += rng.expovariate(1.0)
    return times


def build_trace(scenario: Scenario, rate: float, duration: float, repeat: int = 0) -> list[TraceRequest]:
    """The scenario's requests arriving at ``rate`` per second for ``duration`` seconds; ``repeat``
    draws another sample of the same traffic (runs pool several for steadier figures)."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    traffic = scenario.traffic
    if isinstance(traffic.prompts, MultiTurn):
        return _conversations(scenario, traffic.prompts, rate, duration, repeat)
    times = arrivals(scenario, rate, duration, f"{scenario.seed}:{repeat}:arrivals")
    shapes = random.Random(f"{scenario.seed}:{repeat}:requests")
    draw = ModelMix.of(traffic).drawer()
    if isinstance(traffic.prompts, SharedPrefix):
        return _shared_prefix(scenario, traffic.prompts, times, shapes, draw)
    trace = []
    for at in times:
        if traffic.lengths.dataset == "fixed":
            prompt, output = traffic.lengths.prompt_tokens, traffic.lengths.output_tokens
        else:
            prompt, output = lognormal(shapes, SHAREGPT_PROMPT), lognormal(shapes, SHAREGPT_OUTPUT)
        trace.append(TraceRequest(at, prompt, output, draw(shapes)))
    return trace


def _seed(scenario: Scenario, *parts: object) -> int:
    """A span's seed: the same parts give the same tokens in every run, at every rate."""
    return zlib.crc32(":".join(map(str, (scenario.seed, *parts))).encode())


def _shared_prefix(
    scenario: Scenario, spec: SharedPrefix, times: list[float], shapes: random.Random, draw: _Draw
) -> list[TraceRequest]:
    names = ModelMix.of(scenario.traffic).names
    trace = []
    for at in times:
        model = draw(shapes)
        group = names.index(model) if spec.per_adapter else shapes.randrange(spec.num_groups)
        prompt = shapes.randrange(spec.num_prompts_per_group)
        system = Span(_seed(scenario, "system", group), spec.system_prompt_len)
        question = Span(_seed(scenario, "question", group, prompt), spec.question_len)
        tokens = (system, question) if spec.system_prompt_len else (question,)
        length = spec.system_prompt_len + spec.question_len
        trace.append(TraceRequest(at, length, spec.output_len, model, tokens))
    return trace


def _conversations(
    scenario: Scenario, spec: MultiTurn, rate: float, duration: float, repeat: int
) -> list[TraceRequest]:
    """Every turn of the conversations that start within ``duration``, sorted by arrival. The starts
    are the arrival process at ``rate / turns``; think times come from the conversation's own stream,
    so a conversation's turns are the same ones at every rate, only its start moves."""
    starts = arrivals(scenario, rate / spec.turns, duration, f"{scenario.seed}:{repeat}:arrivals")
    draw = ModelMix.of(scenario.traffic).drawer()
    trace = []
    for number, start in enumerate(starts):
        stream = random.Random(f"{scenario.seed}:{repeat}:conversation:{number}")
        model = draw(stream)
        context: tuple[Span, ...] = ()
        if spec.system_prompt_len:
            # One system prompt per model, as an application's: shared by its conversations.
            context = (Span(_seed(scenario, "system", model), spec.system_prompt_len),)
        at = start
        for turn in range(spec.turns):
            question = Span(_seed(scenario, repeat, number, turn, "question"), spec.question_len)
            answer = Span(_seed(scenario, repeat, number, turn, "answer"), spec.output_len)
            context += (question,)
            prompt = sum(span.length for span in context)
            # The answer's tokens too: the next turn's prompt repeats them.
            trace.append(TraceRequest(at, prompt, spec.output_len, model, (*context, answer)))
            context += (answer,)
            at += stream.expovariate(1.0 / spec.think_time)
    trace.sort(key=lambda r: r.arrival)
    return trace
