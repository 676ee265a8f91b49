"""The filters, one table each: what each keeps (upstream's cases 4 and 5 for the #423 filters; the
`best` profile's least-work and LoRA spread-affinity filters), and each one's type name and contract."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from typing import Any

import pytest
from picker_builders import pod, state

from pointsman_picker.scheduling import SchedulingRequest
from pointsman_picker.scheduling.adapter_slots import RESIDENT, UNSEEN_ADAPTERS
from pointsman_picker.scheduling.assignments import POSITIONS
from pointsman_picker.scheduling.backlog import PENDING_PREFILL
from pointsman_picker.scheduling.filters import (
    CriticalRequest,
    HasCapacity,
    LeastKvCache,
    LeastQueuing,
    LeastWork,
    LoraSoftAffinity,
    LoraSpreadAffinity,
    LowQueueing,
)
from pointsman_picker.scheduling.indexed import SMALL, indexed
from pointsman_picker.scheduling.prefix_cache import PrefixMatch
from pointsman_picker.scheduling.recent_targets import RECENT_TARGETS
from pointsman_shared.snapshot import PodSnapshot

CRITICAL = SchedulingRequest(target_model="critical", critical=True)


def addresses(pods: Any) -> list[str]:
    return [p.address for p in pods]


def busy(waiting: int = 0, running: int = 0, kv: float = 0.0, **kw: Any) -> PodSnapshot:
    return dataclasses.replace(pod(waiting, kv, **kw), running=running)


def request(target: str | None = "x") -> SchedulingRequest:
    return SchedulingRequest(target, critical=True)


@pytest.mark.parametrize(
    ("filter_", "type_name", "consumes"),
    [
        (CriticalRequest(), "critical-request-filter", ()),
        (LowQueueing(128), "low-queue-filter", ()),
        (HasCapacity(5, 0.8), "has-capacity-filter", ()),
        (LeastQueuing(), "least-queue-filter", ()),
        (LeastKvCache(), "least-kv-cache-filter", ()),
        (LoraSoftAffinity(0.999), "lora-affinity-filter", ()),
        (
            LoraSpreadAffinity(0.999, 0.1, 8.0),
            "lora-spread-affinity-filter",
            (RECENT_TARGETS, RESIDENT, UNSEEN_ADAPTERS),
        ),
        (LeastWork(0.0345, 0.04, 20.0, 7.0, 3.5), "least-work-filter", (PENDING_PREFILL,)),
    ],
)
def test_each_filter_has_a_type_name_and_declares_what_it_consumes(filter_, type_name, consumes):
    assert filter_.type_name == type_name
    assert filter_.consumes == consumes


@pytest.mark.parametrize(
    ("request_", "expected"), [(CRITICAL, ["a", "b"]), (SchedulingRequest("critical", critical=False), [])]
)
def test_critical_request(request_, expected):
    pods = (pod(address="a"), pod(500, 1.0, address="b"))
    assert addresses(CriticalRequest()(request_, pods, state(), random.Random(0))) == expected


@pytest.mark.parametrize(
    ("fn", "pods", "expected"),
    [
        # 4: least queuing on 0, 3, 10 keeps 0 and 3 (band 0 + 10 // 3 = 3)
        (LeastQueuing(), [pod(0, address="a"), pod(3, address="b"), pod(10, address="c")], ["a", "b"]),
        # integer division: 0 + 5 // 2 = 2 keeps only 0
        (LeastQueuing(), [pod(0, address="a"), pod(5, address="b")], ["a"]),
        (LeastQueuing(), [pod(7, address="a"), pod(7, address="b")], ["a", "b"]),
        # 4: least KV on 0, 0.3, 1.0 keeps 0 and 0.3 (band 0 + 1.0 / 3)
        (
            LeastKvCache(),
            [pod(kv=0, address="a"), pod(kv=0.3, address="b"), pod(kv=1.0, address="c")],
            ["a", "b"],
        ),
        # float division: 0 + 0.5 / 2 = 0.25 keeps 0.25
        (
            LeastKvCache(),
            [pod(kv=0, address="a"), pod(kv=0.5, address="b"), pod(kv=0.25, address="c")],
            ["a"],
        ),
        (LeastQueuing(), [], []),
        (LeastKvCache(), [], []),
    ],
)
def test_least_bands(fn, pods, expected):
    assert addresses(fn(CRITICAL, tuple(pods), state(), random.Random(0))) == expected


@pytest.mark.parametrize(
    ("fn", "pods", "expected"),
    [
        (LowQueueing(128), [pod(127, address="a"), pod(128, address="b")], ["a"]),
        (
            HasCapacity(5, 0.8),
            [pod(5, 0.8, address="a"), pod(6, 0.1, address="b"), pod(0, 0.81, address="c")],
            ["a"],
        ),
    ],
)
def test_threshold_filters(fn, pods, expected):
    assert addresses(fn(CRITICAL, tuple(pods), state(), random.Random(0))) == expected


@pytest.mark.parametrize(
    ("name", "pods", "expected"),
    [
        ("only affinity", [pod(max_lora=1, adapters={"t"}, address="a"), pod(address="b")], ["a"]),
        (
            "only free slot",
            [pod(max_lora=1, address="a"), pod(max_lora=1, adapters={"x"}, address="b")],
            ["a"],
        ),
        ("waiting adapters count as active", [pod(max_lora=1, waiting_adapters={"t"}, address="a")], ["a"]),
        ("neither: failure", [pod(max_lora=1, adapters={"x"}, address="a")], []),
    ],
)
def test_lora_soft_affinity_groups(name, pods, expected):
    fn = LoraSoftAffinity(0.999)
    assert addresses(fn(SchedulingRequest("t", True), tuple(pods), state(), random.Random(0))) == expected, (
        name
    )


def test_case5_soft_affinity_distribution():
    fn = LoraSoftAffinity(0.999)
    pods = (pod(max_lora=2, adapters={"t"}, address="affinity"), pod(max_lora=2, address="available"))
    rng = random.Random(423)
    draws = Counter(fn(SchedulingRequest("t", True), pods, state(), rng)[0].address for _ in range(10_000))
    share = draws["affinity"] / 10_000 * 100
    assert 99.9 - 5 <= share <= 99.9 + 5
    assert draws["available"] > 0


def test_soft_affinity_follows_the_configured_threshold():
    fn = LoraSoftAffinity(0.0)
    pods = (pod(max_lora=2, adapters={"t"}, address="affinity"), pod(max_lora=2, address="available"))
    assert addresses(fn(SchedulingRequest("t", True), pods, state(), random.Random(0))) == ["available"]


def test_no_target_model_has_no_affinity():
    fn = LoraSoftAffinity(1.0)
    pods = (pod(max_lora=1, adapters={"t"}, address="a"), pod(max_lora=1, address="b"))
    assert addresses(fn(SchedulingRequest(None, True), pods, state(), random.Random(0))) == ["b"]


# -- least work -------------------------------------------------------------------------------------
# (perPendingToken, perRunning, perKvCache, perWaiting, tolerance)
MS = (0.0345, 0.04, 20.0, 7.0, 3.5)


@pytest.mark.parametrize(
    ("name", "weights", "pods", "pending", "expected"),
    [
        ("all idle: all kept", MS, [busy(address="a"), busy(address="b")], {}, ["a", "b"]),
        (
            "a long prompt assigned lately sends the next one elsewhere",
            MS,
            [busy(address="a"), busy(address="b")],
            {"a": 1500.0},
            ["b"],
        ),
        (
            "a few pending tokens are within the tolerance",
            MS,
            [busy(address="a"), busy(address="b")],
            {"a": 50.0},
            ["a", "b"],
        ),
        (
            "a waiting request weighs 7 ms",
            MS,
            [busy(1, address="a"), busy(0, address="b"), busy(0, 50, address="c")],
            {},
            ["b", "c"],
        ),
        (
            "running and KV cache add up against pending tokens",
            MS,
            [busy(0, 200, 0.5, address="a"), busy(address="b")],
            {"b": 400.0},
            ["b"],
        ),
        (
            "weights of 0 ignore a signal",
            (0.0, 0.0, 0.0, 1.0, 0.0),
            [busy(0, 200, 0.9, address="a"), busy(1, address="b")],
            {"a": 9999.0},
            ["a"],
        ),
        ("one pod is kept as it is", MS, [busy(9, address="a")], {"a": 10_000.0}, ["a"]),
        ("no pods", MS, [], {}, []),
    ],
)
def test_least_work(name, weights, pods, pending, expected):
    kept = LeastWork(*weights)(request(), tuple(pods), state(pending=pending), random.Random(0))
    assert addresses(kept) == expected, name


# -- LoRA spread affinity ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "pods", "expected"),
    [
        (
            "the pods with the adapter while they are not much busier than the mean",
            [
                busy(0, 100, max_lora=2, adapters={"x"}, address="near"),
                busy(0, 95, max_lora=2, address="free"),
            ],
            ["near"],
        ),
        (
            "spread to a free slot once the adapter's pods are past the mean by 10% + 8",
            [
                busy(0, 150, max_lora=2, adapters={"x"}, address="near"),  # mean 125: limit 145.5
                busy(0, 100, max_lora=2, address="free"),
            ],
            ["free"],
        ),
        (
            "the least loaded of the adapter's pods decides",
            [
                busy(0, 110, max_lora=2, adapters={"x"}, address="near1"),
                busy(0, 100, max_lora=2, adapters={"x"}, address="near2"),
                busy(0, 100, max_lora=2, address="free"),
            ],
            ["near1", "near2"],
        ),
        (
            "of the adapter's pods, those within 10% + 8 of the least loaded one",
            [
                busy(0, 300, max_lora=2, adapters={"x"}, address="far"),  # 100 * 1.1 + 8 = 118
                busy(0, 100, max_lora=2, adapters={"x"}, address="near"),
                busy(0, 118, max_lora=2, adapters={"x"}, address="edge"),
                busy(0, 100, max_lora=2, address="free"),
            ],
            ["near", "edge"],
        ),
        (
            "waiting counts as load",
            [busy(30, 0, max_lora=2, adapters={"x"}, address="near"), busy(0, 0, max_lora=2, address="free")],
            ["free"],
        ),
        (
            "no spreading while an adapter somewhere waits for a slot",
            [
                busy(0, 150, max_lora=2, adapters={"x"}, address="near"),
                busy(0, 100, max_lora=2, address="free"),
                busy(0, 125, max_lora=1, adapters={"y"}, waiting_adapters={"z"}, address="starved"),
            ],
            ["near"],
        ),
        (
            "a pod whose slots are all taken is never spread to",
            [
                busy(0, 300, max_lora=1, adapters={"x"}, address="near"),
                busy(0, 0, max_lora=1, adapters={"y"}, address="full"),
            ],
            ["near"],
        ),
        (
            "where the adapter runs, not where it waits for a slot others hold",
            [
                busy(0, 100, max_lora=2, adapters={"x"}, address="runs"),
                busy(0, 10, max_lora=1, adapters={"y"}, waiting_adapters={"x"}, address="waits"),
                busy(0, 100, max_lora=2, address="free"),
            ],
            ["runs"],
        ),
        (
            "where it waits with a slot free it is about to run: kept",
            [
                busy(0, 10, max_lora=2, adapters={"x"}, address="runs"),
                busy(0, 10, max_lora=2, adapters={"y"}, waiting_adapters={"x"}, address="queued"),
                busy(0, 100, max_lora=3, address="free"),
            ],
            ["runs", "queued"],
        ),
        (
            "it only waits for a slot where it is: a free slot first",
            [
                busy(0, 10, max_lora=1, adapters={"y"}, waiting_adapters={"x"}, address="waits"),
                busy(0, 100, max_lora=2, address="free"),
            ],
            ["free"],
        ),
        (
            "it only waits wherever it is: those pods",
            [
                busy(0, 10, max_lora=1, adapters={"y"}, waiting_adapters={"x"}, address="waits1"),
                busy(0, 20, max_lora=1, adapters={"z"}, waiting_adapters={"x"}, address="waits2"),
            ],
            ["waits1", "waits2"],
        ),
        (
            "no pod has the adapter: the free slots",
            [
                busy(0, 0, max_lora=1, adapters={"y"}, address="full"),
                busy(0, 50, max_lora=2, adapters={"y"}, address="free"),
            ],
            ["free"],
        ),
        (
            "no adapter pod and no free slot: nothing",
            [busy(0, 0, max_lora=1, adapters={"y"}, address="full")],
            [],
        ),
    ],
)
def test_lora_spread_affinity(name, pods, expected):
    kept = LoraSpreadAffinity(1.0, 0.1, 8.0)(request(), tuple(pods), state(), random.Random(0))
    assert addresses(kept) == expected, name


@pytest.mark.parametrize(
    ("name", "recent", "share", "expected"),
    [
        ("targets unknown (0): spread", 0, 0.75, ["free"]),
        ("few adapters for the slots: spread", 3, 0.75, ["free"]),
        ("exactly the share of the 4 slots: spread", 3, 0.75, ["free"]),
        ("more adapters than the share of the slots: stay", 4, 0.75, ["near"]),
        ("a share of 1 allows one adapter per slot", 4, 1.0, ["free"]),
    ],
)
def test_lora_spread_affinity_leaves_the_slots_to_adapters_when_there_are_many(name, recent, share, expected):
    pods = (
        busy(0, 150, max_lora=2, adapters={"x"}, address="near"),
        busy(0, 100, max_lora=2, address="free"),
    )
    fn = LoraSpreadAffinity(1.0, 0.1, 8.0, share)
    assert addresses(fn(request(), pods, state(recent_targets=recent), random.Random(0))) == expected, name


def test_lora_spread_affinity_keeps_the_soft_threshold():
    pods = (busy(max_lora=2, adapters={"x"}, address="near"), busy(max_lora=2, address="free"))
    fn = LoraSpreadAffinity(0.9, 0.1, 8.0)
    rng = random.Random(3)
    picks = [addresses(fn(request(), pods, state(), rng)) for _ in range(2000)]
    assert 0.85 < picks.count(["near"]) / len(picks) < 0.95


def lora_state(
    *, unseen: dict[str, set[str]] | None = None, resident: set[str] | None = None, recent: int | None = None
) -> Any:
    out = state(recent_targets=recent)
    if unseen is not None:
        out[UNSEEN_ADAPTERS] = {address: frozenset(adapters) for address, adapters in unseen.items()}
    if resident is not None:
        out[RESIDENT] = frozenset(resident)
    return out


@pytest.mark.parametrize(
    ("name", "pods", "given", "expected"),
    [
        (
            "an adapter sent to a pod since its scrape is near there",
            [busy(0, 10, max_lora=2, address="sent"), busy(0, 10, max_lora=2, address="other")],
            lora_state(unseen={"sent": {"x"}}),
            ["sent"],
        ),
        (
            "a slot that adapters sent since the scrape fill is not free",
            [busy(0, 10, max_lora=1, address="filled"), busy(0, 10, max_lora=2, address="free")],
            lora_state(unseen={"filled": {"y"}}),
            ["free"],
        ),
        (
            "an adapter sent unseen to a pod whose slots others hold waits there: the free slot first",
            [
                busy(0, 10, max_lora=1, adapters={"y"}, address="waits"),
                busy(0, 10, max_lora=2, address="free"),
            ],
            lora_state(unseen={"waits": {"x"}}),
            ["free"],
        ),
        (
            "where the adapter runs with its slots in hand, not where another waits for one of them",
            [
                busy(0, 10, max_lora=1, adapters={"x"}, waiting_adapters={"y"}, address="crowded"),
                busy(0, 10, max_lora=2, adapters={"x"}, address="roomy"),
            ],
            lora_state(),
            ["roomy"],
        ),
        (
            "an adapter sent since the scrape crowds a pod too",
            [
                busy(0, 10, max_lora=1, adapters={"x"}, address="crowded"),
                busy(0, 10, max_lora=2, adapters={"x"}, address="roomy"),
            ],
            lora_state(unseen={"crowded": {"y"}}),
            ["roomy"],
        ),
        (
            "active nowhere: the free slot where it probably still sits idle",
            [busy(0, 10, max_lora=2, address="cold"), busy(0, 10, max_lora=2, address="warm")],
            lora_state(resident={"warm"}),
            ["warm"],
        ),
        (
            "active somewhere: the pods where it is active, not where it may sit idle",
            [
                busy(0, 10, max_lora=2, adapters={"x"}, address="active"),
                busy(0, 10, max_lora=2, address="warm"),
            ],
            lora_state(resident={"warm"}),
            ["active"],
        ),
        (
            "many adapters for the slots: where it waits, as soft affinity, not a slot another wants",
            [
                busy(0, 10, max_lora=1, adapters={"y"}, waiting_adapters={"x"}, address="waits"),
                busy(0, 10, max_lora=2, address="free"),
            ],
            lora_state(recent=4),  # more than 0.75 of the 3 slots
            ["waits"],
        ),
    ],
)
def test_lora_spread_affinity_reads_what_the_snapshot_does_not_show(name, pods, given, expected):
    kept = LoraSpreadAffinity(1.0, 0.1, 8.0)(request(), tuple(pods), given, random.Random(0))
    assert addresses(kept) == expected, name


def test_lora_spread_affinity_reads_unseen_adapters_on_a_pool_and_on_a_subset_alike():
    pool = indexed(tuple(busy(0, 10, max_lora=2, address=f"p{i}") for i in range(SMALL)))
    given = lora_state(unseen={"p3": {"x"}, "p5": {"y"}})
    given[POSITIONS] = {p.address: i for i, p in enumerate(pool)}
    fn = LoraSpreadAffinity(1.0, 0.1, 8.0)
    assert addresses(fn(request(), pool, given, random.Random(0))) == ["p3"]
    assert addresses(fn(request(), tuple(pool[2:6]), given, random.Random(0))) == ["p3"]


@pytest.mark.parametrize(
    ("name", "matched", "expected"),
    [
        ("no prefix index: the band alone", None, ["light"]),
        ("the busy pod holds more of the prompt: kept for least work", {"busy": 4}, ["busy", "light"]),
        ("it holds no more than the least loaded one: out", {"busy": 4, "light": 4}, ["light"]),
    ],
)
def test_lora_spread_affinity_band_keeps_the_pods_holding_more_of_the_prompt(name, matched, expected):
    pods = (
        busy(0, 300, max_lora=2, adapters={"x"}, address="busy"),
        busy(0, 100, max_lora=2, adapters={"x"}, address="light"),
    )
    given = state() if matched is None else state(prefix=PrefixMatch((1, 2, 3, 4), matched, ()))
    kept = LoraSpreadAffinity(1.0, 0.1, 8.0)(request(), pods, given, random.Random(0))
    assert addresses(kept) == expected, name


@pytest.mark.parametrize(
    ("name", "held_ratio", "matched", "expected"),
    [
        # near carries 150, the mean is 125: past 125 * 1.1 + 8 = 145.5, short of 125 * 1.5 + 8 = 195.5
        ("no held ratio: spreads as ever", None, {"near": 4}, ["free"]),
        ("the adapter's pod holds the prompt: the held bound, not passed", 0.5, {"near": 4}, ["near"]),
        ("it holds half of it: held", 0.5, {"near": 2}, ["near"]),
        ("it holds less than half: the usual bound", 0.5, {"near": 1}, ["free"]),
        ("only the free pod holds it: the usual bound", 0.5, {"free": 4}, ["free"]),
        ("no prefix index: the usual bound", 0.5, None, ["free"]),
        ("the held bound passed too: spreads", 0.1, {"near": 4}, ["free"]),
    ],
)
def test_lora_spread_affinity_spreads_a_held_prompt_later(name, held_ratio, matched, expected):
    pods = (
        busy(0, 150, max_lora=2, adapters={"x"}, address="near"),
        busy(0, 100, max_lora=2, address="free"),
    )
    given = state() if matched is None else state(prefix=PrefixMatch((1, 2, 3, 4), matched, ()))
    fn = LoraSpreadAffinity(1.0, 0.1, 8.0, 0.75, held_ratio, 8.0)
    assert addresses(fn(request(), pods, given, random.Random(0))) == expected, name


@pytest.mark.parametrize(
    ("name", "held_ratio", "matched", "near_share"),
    [
        ("no held ratio: the draw sends a tenth to the free slot", None, {"near": 4}, (0.85, 0.95)),
        ("a held prompt is never sent off by the draw", 0.5, {"near": 4}, (1.0, 1.0)),
        ("a prompt not held: the draw as ever", 0.5, {"near": 1}, (0.85, 0.95)),
    ],
)
def test_lora_spread_affinity_keeps_a_held_prompt_from_the_soft_threshold(
    name, held_ratio, matched, near_share
):
    pods = (busy(max_lora=2, adapters={"x"}, address="near"), busy(max_lora=2, address="free"))
    fn = LoraSpreadAffinity(0.9, 0.1, 8.0, 0.75, held_ratio, 8.0)
    given = state(prefix=PrefixMatch((1, 2, 3, 4), matched, ()))
    rng = random.Random(3)
    picks = [addresses(fn(request(), pods, given, rng)) for _ in range(2000)]
    low, high = near_share
    assert low <= picks.count(["near"]) / len(picks) <= high, name
