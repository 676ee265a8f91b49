"""The prefix-cache producer as a lifecycle plugin: hashed once in prepare, recorded for the picked pod,
auto-tuned from the pods, announced to and learnt from other pickers, pods that left forgotten."""

from __future__ import annotations

import dataclasses
from math import exp

import pytest
from picker_builders import pod, pool_pods

from pointsman_picker.scheduling import CycleState, SchedulingRequest, Ticket
from pointsman_picker.scheduling.assignments import POSITIONS
from pointsman_picker.scheduling.prefix_cache import (
    PREFIX_MATCH,
    PREFIX_TRAFFIC,
    Announcement,
    FirstBlockTraffic,
    PrefixCacheProducer,
)
from pointsman_picker.scheduling.prefix_index import block_hashes
from pointsman_picker.scheduling.scorers import PrefixCacheScorer

PODS = pool_pods(pod(), pod(), pod())
A, B, C = (p.address for p in PODS)
SYSTEM = ("You are a helpful assistant. " * 23)[:640]  # 10 blocks of 64 characters
Q1, Q2 = "first question? " * 8, "other question? " * 8  # 2 blocks each


def request(text: str, model: str = "m", **body: object) -> SchedulingRequest:
    return SchedulingRequest(model, critical=True, body={"model": model, "prompt": text, **body})


def prepared(plugin: PrefixCacheProducer, req: SchedulingRequest, pods=PODS, now: float = 0.0) -> CycleState:
    state = CycleState()
    state[POSITIONS] = {p.address: i for i, p in enumerate(pods)}
    plugin.prepare(req, pods, state, now)
    return state


def route(plugin: PrefixCacheProducer, req: SchedulingRequest, address: str, now: float = 0.0) -> CycleState:
    state = prepared(plugin, req, now=now)
    plugin.picked(Ticket(1, address, now), req, state)
    return state


def scores(plugin: PrefixCacheProducer, req: SchedulingRequest, pods=PODS) -> list[float]:
    return PrefixCacheScorer()(req, pods, prepared(plugin, req, pods))


def test_scores_are_matched_over_total_blocks():
    plugin = PrefixCacheProducer(auto_tune=False)
    route(plugin, request(SYSTEM + Q1), A)
    assert scores(plugin, request(SYSTEM + Q2)) == [10 / 12, 0.0, 0.0]  # the system prompt's 10 of 12
    assert scores(plugin, request(SYSTEM + Q1)) == [1.0, 0.0, 0.0]
    assert scores(plugin, request(Q1 + SYSTEM)) == [0.0, 0.0, 0.0]  # a prefix, not any shared text
    assert scores(plugin, request("short")) == [0.0, 0.0, 0.0]  # under a block: nothing to match
    assert scores(plugin, request(SYSTEM + Q1, model="other")) == [0.0, 0.0, 0.0]
    assert scores(plugin, request(SYSTEM + Q1, cache_salt="s")) == [0.0, 0.0, 0.0]


def test_chat_messages_are_hashed_as_serialized():
    plugin = PrefixCacheProducer(auto_tune=False)
    system = {"role": "system", "content": SYSTEM}
    turn1 = SchedulingRequest("m", True, {"messages": [system, {"role": "user", "content": "hi"}]})
    route(plugin, turn1, B)
    turn2 = SchedulingRequest(
        "m", True, {"messages": [system, {"role": "user", "content": "hi"}, {"role": "user", "content": "x"}]}
    )
    assert scores(plugin, turn2)[1] > 0.8


def test_prepare_hashes_once_and_picked_records_the_chosen_pod():
    plugin = PrefixCacheProducer(auto_tune=False)
    req = request(SYSTEM)
    state = prepared(plugin, req)
    match = state[PREFIX_MATCH]
    assert match.hashes == block_hashes("m", "", SYSTEM.encode(), 64, 256)
    assert match.matched == {}
    plugin.picked(Ticket(1, C, 0.0), req, state)
    assert prepared(plugin, req)[PREFIX_MATCH].matched == {C: len(match.hashes)}
    assert plugin.note(prepared(plugin, req)) == f"prefix {len(match.hashes)}/{len(match.hashes)}"


@pytest.mark.parametrize(
    ("arrivals", "share"),
    [
        ([(1, 0.0)], 1.0),  # the first request: all the traffic so far
        ([(1, 0.0), (2, 0.0)], 0.5),
        ([(2, 0.0), (2, 0.0), (2, 0.0), (1, 0.0)], 0.25),
        ([(1, 0.0), (2, 10.0), (1, 10.0)], (1 + exp(-1)) / (2 + exp(-1))),  # 10 s on: 1/e of the first
        ([(1, 0.0), *[(2, 0.0)] * 8, (1, 100.0)], (1 + exp(-10)) / (1 + 9 * exp(-10))),  # all decayed
        ([(1, 0.0), (2, 0.0), (3, 0.0), (1, 0.0)], 0.25),  # block 1 forgotten (limit 2): counts anew
        ([(1, 5.0), (2, 0.0)], 0.5),  # a time before the last: no decay, none undone
    ],
)
def test_first_block_traffic_is_the_decayed_share_of_requests(arrivals, share):
    traffic = FirstBlockTraffic(tau=10.0, limit=2)
    got = [traffic.add(first, now) for first, now in arrivals][-1]
    assert got == pytest.approx(share, rel=1e-6)


def test_prepare_writes_the_prefix_traffic_in_pods_shares():
    plugin = PrefixCacheProducer(auto_tune=False)
    assert prepared(plugin, request(SYSTEM + Q1))[PREFIX_TRAFFIC] == 3.0  # all of it, 3 pods' shares
    assert prepared(plugin, request(Q1 + SYSTEM))[PREFIX_TRAFFIC] == pytest.approx(1.5)
    assert prepared(plugin, request(SYSTEM + Q2))[PREFIX_TRAFFIC] == pytest.approx(2.0)  # 2 of 3
    assert PREFIX_TRAFFIC not in prepared(plugin, request("short"))  # no block: nothing to share


def test_auto_tune_takes_the_block_size_and_capacity_from_the_pods():
    # vLLM's cache_config_info, as the collector puts it in the snapshot
    pods = (
        dataclasses.replace(PODS[0], block_size=32, num_gpu_blocks=3),
        dataclasses.replace(PODS[1], block_size=32),
    )
    plugin = PrefixCacheProducer(capacity=1000)
    req = request(SYSTEM)
    state = prepared(plugin, req, pods)
    assert state[PREFIX_MATCH].hashes == block_hashes("m", "", SYSTEM.encode(), 128, 256)
    plugin.picked(Ticket(1, A, 0.0), req, state)
    assert len(plugin.index) == 3  # A's capacity: its num_gpu_blocks
    plugin.picked(Ticket(2, B, 0.0), req, state)
    assert len(plugin.index) == 3 + 5  # B exports none: lruCapacityPerServer
    fixed = PrefixCacheProducer(auto_tune=False, block_tokens=8)
    assert prepared(fixed, req, pods)[PREFIX_MATCH].hashes == block_hashes("m", "", SYSTEM.encode(), 32, 256)


@pytest.mark.parametrize(
    ("params", "chars", "blocks"),
    [
        ({"block_chars": 100}, 100, 256),  # hashBlockSize (v1.0), blockSize (v1.1-v1.3)
        ({"block_tokens": 4, "max_blocks": 3}, 16, 3),
        ({"block_tokens": 4, "max_tokens": 8}, 16, 2),  # maxPrefixTokensToMatch wins
    ],
)
def test_block_size_and_bound_parameters(params, chars, blocks):
    plugin = PrefixCacheProducer(auto_tune=False, **params)
    assert prepared(plugin, request(SYSTEM))[PREFIX_MATCH].hashes == block_hashes(
        "m", "", SYSTEM.encode(), chars, blocks
    )


def test_new_blocks_are_announced_and_announcements_are_learnt():
    one, two = PrefixCacheProducer(auto_tune=False), PrefixCacheProducer(auto_tune=False)
    route(one, request(SYSTEM + Q1), A, now=1.0)
    hashes = prepared(one, request(SYSTEM + Q1))[PREFIX_MATCH].hashes
    assert one.outbox() == len(hashes)
    route(one, request(SYSTEM + Q1), A, now=2.0)
    assert one.outbox() == len(hashes)  # nothing new
    sent = one.drain(4) + one.drain(100)
    assert sent == [Announcement(A, hashes[:4], 1.0), Announcement(A, hashes[4:], 1.0)]
    assert one.outbox() == 0
    two.learn(sent)
    assert scores(two, request(SYSTEM + Q1)) == [1.0, 0.0, 0.0]
    assert two.outbox() == 0  # learnt blocks are not announced again


def test_the_outbox_is_bounded():
    plugin = PrefixCacheProducer(auto_tune=False, outbox_limit=10)
    route(plugin, request(SYSTEM), A)  # 10 blocks
    route(plugin, request(SYSTEM), B)
    assert plugin.outbox() == 10
    assert plugin.dropped == 10
    assert [a.pod for a in plugin.drain(100)] == [B]


def test_pods_missing_at_two_purges_are_forgotten():
    plugin = PrefixCacheProducer(auto_tune=False, purge_every=10.0)
    route(plugin, request(SYSTEM), A, now=0.0)
    without_a = PODS[1:]
    prepared(plugin, request(SYSTEM), without_a, now=10.0)  # missing once: kept (a scrape may fail)
    assert plugin.index.pods() == [A]
    prepared(plugin, request(SYSTEM), PODS, now=20.0)
    prepared(plugin, request(SYSTEM), without_a, now=30.0)
    assert plugin.index.pods() == [A]  # back in between: missing once again
    prepared(plugin, request(SYSTEM), without_a, now=40.0)
    assert plugin.index.pods() == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"block_tokens": 0}, "blockSizeTokens"), ({"capacity": 0}, "lruCapacityPerServer")],
)
def test_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PrefixCacheProducer(**kwargs)
