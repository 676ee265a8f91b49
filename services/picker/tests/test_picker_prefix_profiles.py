"""Prefix-cache affinity in profiles: the scorer and the filter with their producer in the lifecycle,
its parameters from the scorer (or a declared producer, upstream's v1.5 type), the index kept across a
reload of the same spec, translated EndpointPickerConfigs of every release, and the shipped profiles."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from picker_builders import pod, pool_pods

from pointsman_picker.scheduling import CycleState, SchedulingRequest, Ticket
from pointsman_picker.scheduling.assignments import POSITIONS
from pointsman_picker.scheduling.backlog import PENDING_PREFILL, PROMPT_TOKENS
from pointsman_picker.scheduling.filters import LeastWorkWithPrefix, PrefixCacheAffinity
from pointsman_picker.scheduling.prefix_cache import PREFIX_MATCH, PREFIX_TRAFFIC, PrefixCacheProducer
from pointsman_picker.scheduling.profiles import Profile, build_profile
from pointsman_picker.scheduling.registry import PluginError
from pointsman_shared import upstream
from pointsman_shared.config import parse_config

ROOT = Path(__file__).resolve().parents[3]
PROFILES = ROOT / "config" / "profiles"
PODS = pool_pods(pod(), pod(), pod())
PROMPT = "You are a helpful assistant. " * 40


def shipped(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((PROFILES / name).read_text(encoding="utf-8"))
    return doc


def producer(profile: Profile) -> PrefixCacheProducer:
    [plugin] = [p for p in profile.lifecycle.plugins if isinstance(p, PrefixCacheProducer)]
    return plugin


def decide(profile: Profile, prompt: str = PROMPT, pods=PODS, rng: random.Random | None = None) -> str:
    """One request through the profile's lifecycle and its plugins; the chosen pod's address."""
    request = SchedulingRequest("m", True, {"model": "m", "prompt": prompt})
    state = CycleState()
    state[POSITIONS] = {p.address: i for i, p in enumerate(pods)}
    prepared = profile.lifecycle.prepare(request, pods, state, 0.0)
    chosen = profile.schedule(request, prepared, state, rng or random.Random(0))
    assert not isinstance(chosen, type(None))
    profile.lifecycle.picked(Ticket(1, chosen.address, 0.0), request, state)  # type: ignore[union-attr]
    return chosen.address  # type: ignore[union-attr]


def test_gie_default_weighs_queue_kv_prefix_and_lora_as_upstream():
    profile = build_profile(parse_config(shipped("gie-default.yaml")))
    weights = {name: weight for name, weight, _ in profile.scorers}
    assert weights == {
        "queue-scorer": 2,
        "kv-cache-scorer": 2,
        "prefix-cache-scorer": 3,
        "lora-affinity-scorer": 1,
    }
    assert producer(profile).capacity == 31_250


def test_a_prompt_goes_back_to_the_pod_that_holds_its_prefix():
    profile = build_profile(parse_config(shipped("prefix-only.yaml")))
    first = decide(profile)
    assert all(decide(profile, PROMPT + f" question {i}") == first for i in range(5))


def test_the_scorer_s_parameters_make_the_producer():
    doc = shipped("gie-default.yaml")
    doc["plugins"][2]["parameters"] = {"autoTune": False, "blockSizeTokens": 8, "lruCapacityPerServer": 5}
    index = producer(build_profile(parse_config(doc)))
    assert (index.auto_tune, index.capacity, index.block_chars(PODS)) == (False, 5, 32)


def test_a_declared_producer_sets_the_parameters_as_in_upstream_v1_5():
    doc = shipped("prefix-only.yaml")
    doc["plugins"].insert(
        0, {"type": "approx-prefix-cache-producer", "parameters": {"lruCapacityPerServer": 7}}
    )
    assert producer(build_profile(parse_config(doc))).capacity == 7


def test_a_reload_of_the_same_spec_keeps_the_index_and_another_spec_starts_anew():
    config = parse_config(shipped("prefix-only.yaml"))
    running = build_profile(config)
    address = decide(running)
    again = build_profile(config, running.lifecycle.by_spec())
    assert producer(again) is producer(running)
    assert producer(again).index.pods() == [address]
    doc = shipped("prefix-only.yaml")
    doc["plugins"][0]["parameters"] = {"lruCapacityPerServer": 10}
    assert producer(build_profile(parse_config(doc), running.lifecycle.by_spec())).index.pods() == []


@pytest.mark.parametrize(
    ("parameters", "path", "message"),
    [
        ({"blockSizeToken": 16}, "plugins[0].parameters.blockSizeToken", "unknown parameter"),
        ({"lruCapacityPerServer": 0}, "plugins[0].parameters", "lruCapacityPerServer must be positive"),
        ({"autoTune": "yes"}, "plugins[0].parameters", "autoTune must be true or false"),
    ],
)
def test_bad_prefix_parameters_name_their_path(parameters, path, message):
    for kind in ("prefix-cache-scorer", "approx-prefix-cache-producer"):
        doc = shipped("prefix-only.yaml")
        doc["plugins"].insert(0, {"type": kind, "name": "x", "parameters": parameters})
        with pytest.raises(PluginError) as raised:
            build_profile(parse_config(doc))
        assert (raised.value.path, message in raised.value.message) == (path, True)


@pytest.mark.parametrize(
    ("params", "chars", "auto"),
    [
        ({"hashBlockSize": 128}, 128, False),  # v1.0
        ({"blockSize": 96, "autoTune": True}, 96, True),  # v1.2-v1.3
        ({"blockSizeTokens": 32}, 128, True),  # v1.4 on
    ],
)
def test_translated_endpoint_picker_configs_of_every_release_route_by_prefix(params, chars, auto):
    doc = {
        "kind": "EndpointPickerConfig",
        "plugins": [{"type": "queue-scorer"}, {"type": "prefix-cache-scorer", "parameters": params}],
        "schedulingProfiles": [
            {
                "name": "d",
                "plugins": [{"pluginRef": "queue-scorer"}, {"pluginRef": "prefix-cache-scorer", "weight": 3}],
            }
        ],
    }
    translated, warnings = upstream.from_endpoint_picker_config(doc, "epp.yaml")
    index = producer(build_profile(parse_config(translated)))
    assert (warnings, index.block_chars(PODS), index.auto_tune) == ([], chars, auto)


def test_upstream_s_chart_config_translates_to_its_prefix_weights():
    config, _ = upstream.load(ROOT / "shared/tests/data/upstream/default-plugins.yaml", extra={}, environ={})
    profile = build_profile(config)
    assert [(n, w) for n, w, _ in profile.scorers][-1] == ("prefix-cache-scorer", 3)
    producer(profile)


@pytest.mark.parametrize(
    ("matched", "threshold", "kept"),
    [
        ({"a": 9}, 0.8, ["a"]),
        ({"a": 9, "b": 8}, 0.8, ["a", "b"]),
        ({"a": 7}, 0.8, ["a", "b", "c"]),  # nobody sticky: all kept
        ({}, 0.8, ["a", "b", "c"]),
        ({"a": 10}, 0.0, ["a", "b", "c"]),  # off
    ],
)
def test_prefix_cache_affinity_filter(matched, threshold, kept):
    pods = (pod(address="a"), pod(address="b"), pod(address="c"))
    state = CycleState()
    state[PREFIX_MATCH] = (tuple(range(10)), matched, pods)
    result = PrefixCacheAffinity(threshold, 0.0)(SchedulingRequest("m", True), pods, state, random.Random(0))
    assert [p.address for p in result] == kept


def test_the_affinity_filter_explores_with_its_probability():
    pods = (pod(address="a"), pod(address="b"))
    state = CycleState()
    state[PREFIX_MATCH] = ((1,), {"a": 1}, pods)
    rng = random.Random(3)
    explored = sum(
        len(PrefixCacheAffinity(0.8, 0.25)(SchedulingRequest("m", True), pods, state, rng)) == 2
        for _ in range(1000)
    )
    assert 200 < explored < 300


@pytest.mark.parametrize(
    ("matched", "pending", "weight", "kept"),
    [
        ({}, {}, 1.0, ["a", "b", "c"]),  # no hits: the same prefill everywhere
        ({}, {"a": 700.0}, 3.0, ["b", "c"]),  # nothing held: the weight changes nothing
        ({"b": 10}, {}, 1.0, ["b"]),  # b holds the whole prompt: 1,000 tokens less to compute
        ({"b": 5}, {"b": 700.0}, 1.0, ["a", "c"]),  # half of it, behind 700 pending tokens: more work
        ({"b": 5}, {"b": 700.0}, 2.0, ["b"]),  # the 500 held tokens count twice: worth the wait
        ({"a": 9, "b": 10}, {}, 1.0, ["a", "b"]),  # within the tolerance of each other
        ({"a": 9, "b": 10}, {}, 2.0, ["b"]),  # the block between them counts twice: past it
    ],
)
def test_least_work_with_prefix_counts_the_prompt_a_pod_lacks(matched, pending, weight, kept):
    pods = (pod(address="a"), pod(address="b"), pod(address="c"))
    state = CycleState()
    state[PREFIX_MATCH] = (tuple(range(10)), matched, pods)
    state[PROMPT_TOKENS] = 1000
    state[PENDING_PREFILL] = pending
    filter_ = LeastWorkWithPrefix(0.0345, 0.04, 0.0, 0.0, 3.5, weight)
    assert [p.address for p in filter_(SchedulingRequest("m", True), pods, state, random.Random(0))] == kept


@pytest.mark.parametrize(
    ("matched", "pending", "held", "sole", "kept"),
    [
        # 10 blocks of 100 tokens at 0.0345 ms: a pod holding all of them saves 34.5 ms (69 at weight 2)
        ({"b": 10}, {"b": 1500.0}, 1.0, 1.0, ["a", "c"]),  # 51.75 ms pending outweighs 34.5 saved
        ({"b": 10}, {"b": 1500.0}, 1.0, 2.0, ["b"]),  # only b holds it: a second copy costs double
        ({"a": 4, "b": 10}, {"b": 1000.0}, 1.0, 1.0, ["a"]),
        ({"a": 4, "b": 10}, {"b": 1000.0}, 1.0, 2.0, ["b"]),  # the 6 blocks only b holds count twice
        # a and b both hold it, 41.4 ms pending each: copies exist, so the sole weight changes nothing
        ({"a": 10, "b": 10}, {"a": 1200.0, "b": 1200.0}, 1.0, 2.0, ["c"]),
        ({"a": 10, "b": 10}, {"a": 1200.0, "b": 1200.0}, 2.0, 2.0, ["a", "b"]),  # held weight 2 does
        ({"a": 10, "b": 10}, {"a": 1200.0, "b": 1200.0}, 2.0, 1.0, ["a", "b"]),  # sole below held: held
    ],
)
def test_least_work_with_prefix_weighs_blocks_one_pod_holds_alone(matched, pending, held, sole, kept):
    pods = (pod(address="a"), pod(address="b"), pod(address="c"))
    state = CycleState()
    state[PREFIX_MATCH] = (tuple(range(10)), matched, pods)
    state[PROMPT_TOKENS] = 1000
    state[PENDING_PREFILL] = pending
    filter_ = LeastWorkWithPrefix(0.0345, 0.04, 0.0, 0.0, 3.5, held, sole)
    assert [p.address for p in filter_(SchedulingRequest("m", True), pods, state, random.Random(0))] == kept


@pytest.mark.parametrize(
    ("matched", "c_running", "c_pending", "idle_first", "kept"),
    [
        ({"a": 10, "b": 10}, 0, 0.0, False, ["a", "b"]),  # c lacks the prompt a and b hold: 34.5 ms more
        ({"a": 10, "b": 10}, 0, 0.0, True, ["c"]),  # c runs nothing: it takes the replicated prompt
        ({"a": 10, "b": 10}, 1, 0.0, True, ["a", "b"]),  # c runs something: not idle
        ({"a": 10, "b": 10}, 0, 100.0, True, ["a", "b"]),  # prefill sent to c and not yet computed
        ({"a": 10}, 0, 0.0, True, ["a"]),  # only a holds it: no second copy for an idle pod
        ({"a": 10, "b": 4}, 0, 0.0, True, ["a"]),  # a holds 6 blocks alone
        ({}, 0, 0.0, True, ["a", "b", "c"]),  # nothing held: picks as least work, the idle pod too
    ],
)
def test_least_work_with_prefix_gives_a_replicated_prompt_to_an_idle_pod(
    matched, c_running, c_pending, idle_first, kept
):
    pods = (pod(address="a", running=5), pod(address="b", running=5), pod(address="c", running=c_running))
    state = CycleState()
    state[PREFIX_MATCH] = (tuple(range(10)), matched, pods)
    state[PROMPT_TOKENS] = 1000
    state[PENDING_PREFILL] = {"c": c_pending}
    filter_ = LeastWorkWithPrefix(0.0345, 0.04, 0.0, 0.0, 3.5, 1.0, 2.0, idle_first)
    assert [p.address for p in filter_(SchedulingRequest("m", True), pods, state, random.Random(0))] == kept


@pytest.mark.parametrize(
    ("matched", "traffic", "cold", "kept"),
    [
        # 10 blocks of 100 tokens at 0.0345 ms; b holds 2 alone (6.9 ms; 13.8 at sole weight 2, 69 at
        # 10) behind 1,500 pending tokens (51.75 ms)
        ({"b": 2}, None, 10.0, ["a", "c"]),  # no traffic known: hot, the sole weight
        ({"b": 2}, 1.5, 10.0, ["a", "c"]),  # hot: its requests need more than one pod
        ({"b": 2}, 0.5, 1.0, ["a", "c"]),  # cold, no cold weight
        ({"b": 2}, 0.5, 10.0, ["b"]),  # cold: the 2 blocks count 10 times
        ({"b": 2}, 0.5, 1.5, ["a", "c"]),  # a cold weight below the sole weight: the sole weight
        ({"a": 2, "b": 2}, 0.5, 10.0, ["a"]),  # held by two: copies exist, the held weight
    ],
)
def test_least_work_with_prefix_keeps_a_cold_prefix_on_its_one_pod(matched, traffic, cold, kept):
    pods = (pod(address="a"), pod(address="b"), pod(address="c"))
    state = CycleState()
    state[PREFIX_MATCH] = (tuple(range(10)), matched, pods)
    if traffic is not None:
        state[PREFIX_TRAFFIC] = traffic
    state[PROMPT_TOKENS] = 1000
    state[PENDING_PREFILL] = {"b": 1500.0}
    filter_ = LeastWorkWithPrefix(0.0345, 0.04, 0.0, 0.0, 3.5, 1.0, 2.0, False, cold)
    assert [p.address for p in filter_(SchedulingRequest("m", True), pods, state, random.Random(0))] == kept


def test_idle_pod_first_must_be_a_boolean():
    doc = shipped("best.yaml")
    [work] = [p for p in doc["plugins"] if p.get("type") == "least-work-prefix-filter"]
    work["parameters"]["idlePodFirst"] = "yes"
    with pytest.raises(PluginError) as raised:
        build_profile(parse_config(doc))
    assert "idlePodFirst must be true or false" in raised.value.message


def test_best_routes_a_shared_system_prompt_to_the_pod_that_holds_it():
    profile = build_profile(parse_config(shipped("best.yaml")))
    assert producer(profile).capacity == 31_250
    system = "You are a helpful assistant. " * 100
    first = decide(profile, system + "one")
    assert decide(profile, system + "two") == first
