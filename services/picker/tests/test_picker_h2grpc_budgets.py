"""A connection's flood budgets (``h2grpc/budgets.py``): token buckets and the header-block caps."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pointsman_picker.h2grpc.budgets import MAX_SETTINGS, FloodBudgets, TokenBucket
from pointsman_picker.h2grpc.limits import Limits, Rate
from pointsman_picker.h2grpc.wire import ErrorCode, H2ConnectionError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("rate", "events", "granted"),
    [
        # (seconds since the start, per event) -> which were within the budget
        (Rate(3, 1.0), [0, 0, 0, 0], [True, True, True, False]),
        (Rate(3, 1.0), [0, 0, 0, 0, 1.0], [True, True, True, False, True]),
        (Rate(1, 2.0), [0, 0.25, 0.5, 0.5], [True, False, True, False]),  # refilled at 2 a second
        (Rate(2, 1.0), [0, 0, 100, 100, 100], [True, True, True, True, False]),  # never past the burst
        (Rate(1, 1.0), [5, 4, 4.5], [True, False, False]),  # a clock going back refills nothing
    ],
)
def test_a_token_bucket_grants_a_burst_then_its_rate(
    rate: Rate, events: list[float], granted: list[bool]
) -> None:
    bucket = TokenBucket(rate, 0.0)
    assert [bucket.take(at) for at in events] == granted


SPEND: dict[str, Callable[[FloodBudgets], None]] = {
    "stream resets": FloodBudgets.reset,
    "PINGs": FloodBudgets.ping,
    "SETTINGS frames": lambda budgets: budgets.settings(6),
    "empty frames": FloodBudgets.empty,
}


@pytest.mark.parametrize(
    ("what", "limits"),
    [
        ("stream resets", Limits(resets=Rate(4, 1.0))),
        ("PINGs", Limits(pings=Rate(4, 1.0))),
        ("SETTINGS frames", Limits(settings=Rate(4, 1.0))),
        ("empty frames", Limits(empty_frames=Rate(4, 1.0))),
    ],
)
def test_each_budget_is_its_own_and_ends_in_enhance_your_calm(what: str, limits: Limits) -> None:
    clock = Clock()
    budgets = FloodBudgets(limits, clock)
    for _ in range(4):
        SPEND[what](budgets)
    for other, spend in SPEND.items():  # the others' budgets are untouched by this one's
        if other != what:
            spend(budgets)
    with pytest.raises(H2ConnectionError) as raised:
        SPEND[what](budgets)
    assert raised.value.code is ErrorCode.ENHANCE_YOUR_CALM
    assert str(raised.value) == f"more {what} than 4 at once or 1 a second"
    clock.now = 1.0  # a second later, one more
    SPEND[what](budgets)


def test_the_clock_is_read_only_when_a_budgeted_frame_arrives() -> None:
    reads = []
    budgets = FloodBudgets(Limits(), lambda: reads.append(1) or 0.0)
    assert len(reads) == 1  # the buckets' start
    budgets.header_block(100)
    budgets.block_started()
    budgets.continuation()
    budgets.settings_ack()  # the one this side asked for: free
    assert len(reads) == 1
    budgets.settings_ack()  # one more: an empty frame, counted
    assert len(reads) == 2


@pytest.mark.parametrize(
    ("payload_bytes", "allowed"),
    [(0, True), (6, True), (6 * MAX_SETTINGS, True), (6 * MAX_SETTINGS + 6, False)],
)
def test_settings_per_frame(payload_bytes: int, allowed: bool) -> None:
    budgets = FloodBudgets(Limits(), Clock())
    if allowed:
        budgets.settings(payload_bytes)
        return
    with pytest.raises(H2ConnectionError, match=f"more than {MAX_SETTINGS} settings") as raised:
        budgets.settings(payload_bytes)
    assert raised.value.code is ErrorCode.ENHANCE_YOUR_CALM


def test_unasked_for_settings_acknowledgements_spend_the_empty_frame_budget() -> None:
    budgets = FloodBudgets(Limits(empty_frames=Rate(2, 1.0)), Clock())
    budgets.settings_ack()  # the preface's
    budgets.settings_ack()
    budgets.settings_ack()
    with pytest.raises(H2ConnectionError, match="more empty frames than 2"):
        budgets.settings_ack()


@pytest.mark.parametrize(
    ("max_header_list_size", "max_block", "max_continuations"),
    [(1024, 16 * 1024, 8), (16 * 1024, 32 * 1024, 8), (64 * 1024, 128 * 1024, 32)],
)
def test_header_block_caps_follow_the_header_list_size(
    max_header_list_size: int, max_block: int, max_continuations: int
) -> None:
    budgets = FloodBudgets(Limits(max_header_list_size=max_header_list_size), Clock())
    assert (budgets.max_block, budgets.max_continuations) == (max_block, max_continuations)
    budgets.header_block(max_block)
    with pytest.raises(H2ConnectionError) as raised:
        budgets.header_block(max_block + 1)
    assert raised.value.code is ErrorCode.COMPRESSION_ERROR
    assert str(raised.value) == f"a header block of {max_block + 1}+ bytes, past {max_block}"


def test_continuations_are_counted_per_header_block() -> None:
    budgets = FloodBudgets(Limits(), Clock())
    for _ in range(2):  # a new block counts from zero
        budgets.block_started()
        for _ in range(budgets.max_continuations):
            budgets.continuation()
    with pytest.raises(H2ConnectionError, match="more than 8 CONTINUATION frames") as raised:
        budgets.continuation()
    assert raised.value.code is ErrorCode.ENHANCE_YOUR_CALM
