"""Traces from a scenario's traffic: shares, arrival processes, the same requests at every rate."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from quality_builders import scenario

from pointsman_quality.workload import ModelMix, build_trace


def test_groups_share_their_traffic_equally_or_by_zipf() -> None:
    s = scenario(
        traffic={
            "baseShare": 0.2,
            "adapters": [
                {"prefix": "even", "count": 2, "share": 0.4},
                {"prefix": "zipf", "count": 2, "share": 0.4, "zipf": 1.0},
            ],
        }
    )
    mix = ModelMix.of(s.traffic)
    assert mix.names == (None, "even-0", "even-1", "zipf-0", "zipf-1")
    assert mix.weights == pytest.approx((0.2, 0.2, 0.2, 0.4 * 2 / 3, 0.4 / 3))
    assert mix.adapters == ("even-0", "even-1", "zipf-0", "zipf-1")


def test_the_trace_follows_the_shares_and_the_rate() -> None:
    s = scenario(traffic={"baseShare": 0.5, "adapters": [{"prefix": "a", "count": 1, "share": 0.5}]})
    trace = build_trace(s, 200.0, 50.0)
    assert len(trace) == pytest.approx(10_000, rel=0.05)
    counts = Counter(r.adapter for r in trace)
    assert counts[None] / len(trace) == pytest.approx(0.5, abs=0.03)
    assert all(0 <= r.arrival < 50.0 for r in trace)
    assert [r.arrival for r in trace] == sorted(r.arrival for r in trace)


@pytest.mark.parametrize(
    "arrivals", [{"process": "poisson"}, {"process": "on-off", "peakFactor": 3, "onSeconds": 2}]
)
def test_every_rate_sends_the_same_requests_only_sooner(arrivals) -> None:
    """One sample of the traffic scaled to each rate: a run at a higher rate differs from one at a
    lower rate in the load alone, so a capacity search reads each rate's verdict as the load's."""
    s = scenario(traffic={"adapters": [{"prefix": "a", "count": 2, "share": 1}], "arrivals": arrivals})
    slow, fast = build_trace(s, 10.0, 20.0), build_trace(s, 40.0, 20.0)
    assert len(fast) > 3 * len(slow)
    strip = [(r.prompt_tokens, r.max_tokens, r.adapter) for r in slow]
    assert strip == [(r.prompt_tokens, r.max_tokens, r.adapter) for r in fast[: len(slow)]]
    if arrivals["process"] == "poisson":  # the i-th request comes 4 times sooner
        assert [r.arrival * 4 for r in fast[: len(slow)]] == pytest.approx(
            [r.arrival for r in slow], rel=1e-12
        )
    else:  # within its burst, 4 times sooner
        slow_in = [(r.arrival // 6, r.arrival % 6) for r in slow]
        fast_in = [(r.arrival // 6, r.arrival % 6) for r in fast]
        for burst in range(4):
            first = [at for b, at in slow_in if b == burst]
            assert [at * 4 for b, at in fast_in if b == burst][: len(first)] == pytest.approx(first, rel=1e-9)
    assert build_trace(s, 10.0, 20.0) == slow  # and the same seed gives the same trace
    assert build_trace(s, 10.0, 20.0, repeat=1) != slow  # another repeat, another sample


def test_on_off_arrivals_come_in_bursts_at_the_peak_rate_with_the_same_mean() -> None:
    s = scenario(traffic={"baseShare": 1, "arrivals": {"process": "on-off", "peakFactor": 3, "onSeconds": 2}})
    trace = build_trace(s, 30.0, 60.0)
    assert len(trace) == pytest.approx(30 * 60, rel=0.1)
    in_bursts = [r for r in trace if (r.arrival % 6.0) < 2.0]  # each period: 2 s on, 4 s off
    assert len(in_bursts) == len(trace)


def test_fixed_lengths() -> None:
    s = scenario(
        traffic={"baseShare": 1, "lengths": {"dataset": "fixed", "promptTokens": 7, "outputTokens": 9}}
    )
    assert {(r.prompt_tokens, r.max_tokens) for r in build_trace(s, 50.0, 2.0)} == {(7, 9)}


def test_a_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        build_trace(scenario(), 0.0, 1.0)


SHARED = {"kind": "shared-prefix", "numGroups": 3, "numPromptsPerGroup": 2, "systemPromptLen": 64}


@pytest.mark.parametrize(
    ("prompts", "adapters", "groups"),
    [
        pytest.param({**SHARED, "questionLen": 16, "outputLen": 8}, [None], 3, id="groups"),
        pytest.param(
            {**SHARED, "perAdapter": True, "questionLen": 16, "outputLen": 8},
            ["a-0", "a-1"],
            2,
            id="per-adapter",
        ),
    ],
)
def test_shared_prefix_prompts(prompts: dict[str, object], adapters: list[str | None], groups: int) -> None:
    traffic: dict[str, object] = {"prompts": prompts}
    traffic |= (
        {"baseShare": 1} if adapters == [None] else {"adapters": [{"prefix": "a", "count": 2, "share": 1}]}
    )
    trace = build_trace(scenario(traffic=traffic), 100.0, 10.0)
    assert {(r.prompt_tokens, r.max_tokens) for r in trace} == {(80, 8)}
    systems = {r.tokens[0] for r in trace}
    assert len(systems) == groups  # one system prompt per group
    assert len({r.tokens for r in trace}) == groups * 2  # each group's two questions
    if adapters != [None]:
        # Each adapter its own system prompt.
        assert all(len({r.tokens[0] for r in trace if r.adapter == a}) == 1 for a in adapters)
    fast = build_trace(scenario(traffic=traffic), 200.0, 10.0)
    assert [r.tokens for r in fast[: len(trace)]] == [r.tokens for r in trace]  # same requests, sooner


def test_multi_turn_conversations_grow_turn_by_turn() -> None:
    prompts = {"kind": "multi-turn", "turns": 3, "systemPromptLen": 32, "questionLen": 16, "outputLen": 8}
    trace = build_trace(scenario(traffic={"baseShare": 1, "prompts": prompts}), 6.0, 20.0)
    assert len(trace) == pytest.approx(6 * 20, rel=0.3)
    assert [r.arrival for r in trace] == sorted(r.arrival for r in trace)
    by_start: dict[object, list[object]] = {}
    for r in trace:
        by_start.setdefault(r.tokens[1], []).append(r)  # a conversation's first question
    for turns in by_start.values():
        assert [r.prompt_tokens for r in turns] == [48, 72, 96][: len(turns)]  # type: ignore[attr-defined]
        for earlier, later in itertools.pairwise(turns):
            # The next turn's prompt is this turn's prompt and answer, then a question.
            assert later.tokens[: len(earlier.tokens)] == earlier.tokens  # type: ignore[attr-defined]
    # One system prompt for the model, shared by its conversations.
    assert len({r.tokens[0] for r in trace}) == 1
