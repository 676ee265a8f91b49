from __future__ import annotations

from dataclasses import dataclass

import pytest

from pointsman_sim.engine import BLOCK_SIZE, Engine, EngineConfig, RequestRejected, StepTimeModel


@dataclass(frozen=True)
class R:
    """A request to submit: ``R("a1", adapter="a")``."""

    request_id: str
    prompt: int = 16
    out: int = 4
    adapter: str | None = None


def engine(*requests: R, max_num_seqs: int = 8, max_loras: int = 2, blocks: int = 1000) -> Engine:
    e = Engine(EngineConfig(num_gpu_blocks=blocks, max_num_seqs=max_num_seqs, max_loras=max_loras))
    submit(e, *requests)
    return e


def submit(e: Engine, *requests: R, now: float = 0.0) -> None:
    for r in requests:
        e.submit(r.request_id, r.prompt, r.out, r.adapter, now)


def run_to_end(e: Engine, now: float = 0.0, max_steps: int = 10_000) -> float:
    for _ in range(max_steps):
        if not e.has_work:
            return now
        now = e.step(now).ends_at
    raise AssertionError("the engine did not drain")


@pytest.mark.parametrize(
    ("requests", "max_num_seqs", "running", "waiting"),
    [
        pytest.param([R("r1"), R("r2"), R("r3")], 2, {"r1", "r2"}, 1, id="batch-limit"),
        pytest.param([R("r1"), R("r2")], 8, {"r1", "r2"}, 0, id="room-for-all"),
        pytest.param([R(f"r{i}") for i in range(5)], 1, {"r0"}, 4, id="one-at-a-time"),
    ],
)
def test_admits_up_to_max_num_seqs(
    requests: list[R], max_num_seqs: int, running: set[str], waiting: int
) -> None:
    e = engine(*requests, max_num_seqs=max_num_seqs)
    result = e.step(0.0)
    assert set(result.tokens) == running
    assert (e.running_count, e.waiting_count) == (len(running), waiting)


@pytest.mark.parametrize(
    ("running_first", "queued", "admitted", "still_waiting"),
    [
        pytest.param(
            [R("a1", out=50, adapter="a")],
            [R("b1", adapter="b"), R("base"), R("a2", adapter="a")],
            {"base", "a2"},
            {"b1"},
            id="new-adapter-skipped-base-and-loaded-adapter-pass",
        ),
        pytest.param(
            [],
            [R("a1", adapter="a"), R("b1", adapter="b"), R("a2", adapter="a")],
            {"a1", "a2"},
            {"b1"},
            id="slots-fill-within-one-step",
        ),
    ],
)
def test_adapter_beyond_max_loras_waits_without_blocking(
    running_first: list[R], queued: list[R], admitted: set[str], still_waiting: set[str]
) -> None:
    e = engine(*running_first, max_loras=1)
    now = e.step(0.0).ends_at if running_first else 0.0
    submit(e, *queued, now=now)
    result = e.step(now)
    assert set(result.tokens) - {r.request_id for r in running_first} == admitted
    assert e.waiting_count == len(still_waiting)
    assert e.waiting_adapters == {r.adapter for r in queued if r.request_id in still_waiting}
    assert len(e.running_adapters) <= 1


def test_skipped_adapter_keeps_its_place_and_runs_once_a_slot_frees() -> None:
    e = engine(R("a1", out=3, adapter="a"), max_loras=1)
    results = [e.step(0.0)]
    submit(e, R("b1", adapter="b"), R("base", out=100), R("later", out=100), now=results[-1].ends_at)
    while "b1" not in results[-1].tokens:
        results.append(e.step(results[-1].ends_at))
    # b1 got its slot in the very step after a1's last token, ahead of "later" (queued behind it).
    assert [f.request_id for f in results[-2].finished] == ["a1"]
    assert e.running_adapters == {"b"}
    assert "later" in results[1].tokens  # base requests behind b1 were never held up


def test_counts_tokens_and_finishes_after_max_tokens() -> None:
    e = engine(R("r1", prompt=100, out=3), R("r2", prompt=20, out=1))
    results = [e.step(0.0)]
    while e.has_work:
        results.append(e.step(results[-1].ends_at))
    assert [sorted(r.tokens) for r in results] == [["r1", "r2"], ["r1"], ["r1"]]
    assert [sorted(f.request_id for f in r.finished) for r in results] == [["r2"], [], ["r1"]]
    totals = e.totals()
    assert (totals.prompt_tokens, totals.generation_tokens, totals.finished) == (120, 4, 2)
    r1 = results[-1].finished[0]
    assert r1.output_tokens == 3
    assert r1.first_token_at == results[0].ends_at
    assert r1.e2e_latency == pytest.approx(results[-1].ends_at)
    assert e.kv_usage == 0.0


def test_kv_bound_stops_fcfs_admission() -> None:
    # 4 blocks: r1's 48-token prompt takes 3, so r2 (2 blocks) must wait, and r3 behind it too.
    e = engine(R("r1", prompt=48, out=2), R("r2", prompt=32, out=2), R("r3", prompt=1, out=2), blocks=4)
    e.step(0.0)
    assert (e.running_count, e.waiting_count) == (1, 2)
    assert e.kv_usage == pytest.approx(3 / 4)


def test_kv_never_overflows_and_preempted_requests_finish() -> None:
    # Decoding grows every request past its prompt's blocks: the engine must preempt, not overflow.
    requests = [R(f"r{i}", prompt=16, out=40) for i in range(6)]
    e = engine(*requests, blocks=12)
    now, finished, peak = 0.0, set(), 0.0
    while e.has_work:
        result = e.step(now)
        now = result.ends_at
        finished |= {f.request_id for f in result.finished}
        peak = max(peak, e.kv_usage)
    assert finished == {r.request_id for r in requests}
    assert peak <= 1.0
    totals = e.totals()
    assert totals.preemptions > 0
    assert totals.generation_tokens == 6 * 40  # recomputation emits no token twice
    assert totals.prompt_tokens == 6 * 16  # and counts each prompt once


def test_cancel_frees_slot_and_kv() -> None:
    e = engine(R("run", prompt=64, adapter="a"), R("wait", adapter="b"), max_num_seqs=1)
    e.step(0.0)
    assert e.cancel("wait")
    assert e.waiting_adapters == frozenset()
    assert e.cancel("run")
    assert e.kv_usage == 0.0
    assert e.running_adapters == frozenset()
    assert not e.cancel("run")
    assert not e.has_work
    assert e.totals().aborted == 2


@pytest.mark.parametrize(
    ("request_", "config"),
    [
        pytest.param(R("r", prompt=16, out=20), EngineConfig(num_gpu_blocks=2), id="exceeds-kv"),
        pytest.param(R("r", prompt=100, out=29), EngineConfig(max_model_len=128), id="exceeds-context"),
        pytest.param(R("r", adapter="a"), EngineConfig(max_loras=0), id="lora-disabled"),
        pytest.param(R("r", out=0), EngineConfig(), id="no-output"),
    ],
)
def test_rejects_requests_that_could_never_run(request_: R, config: EngineConfig) -> None:
    with pytest.raises(RequestRejected):
        Engine(config).submit(request_.request_id, request_.prompt, request_.out, request_.adapter, 0.0)


def test_request_arriving_after_step_start_waits_for_next_step() -> None:
    e = engine()
    submit(e, R("late"), now=1.0)
    assert e.step(0.5).duration == 0.0
    assert set(e.step(1.0).tokens) == {"late"}


def test_idle_engine_step_is_empty() -> None:
    result = engine().step(3.0)
    assert (result.duration, dict(result.tokens), result.finished) == (0.0, {}, ())


@pytest.mark.parametrize(
    ("prompt", "low_ms", "high_ms"),
    [
        pytest.param(512, 20.0, 40.0, id="ttft-512"),  # docs/vllm-figures.md check 7
        pytest.param(2000, 60.0, 110.0, id="ttft-2000"),
    ],
)
def test_idle_pod_time_to_first_token(prompt: int, low_ms: float, high_ms: float) -> None:
    e = engine(R("r", prompt=prompt, out=1))
    (finished,) = e.step(0.0).finished
    assert low_ms <= finished.time_to_first_token * 1000 <= high_ms


def test_decode_step_time_grows_with_batch_and_lora() -> None:
    model = StepTimeModel()
    one = model.step_seconds(decoding=1, kv_tokens=100, prefill_tokens=0, adapters=0)
    assert one * 1000 == pytest.approx(7.2, rel=0.25)  # docs/vllm-figures.md check 1
    assert model.step_seconds(decoding=64, kv_tokens=6400, prefill_tokens=0, adapters=0) > one
    with_lora = model.step_seconds(decoding=1, kv_tokens=100, prefill_tokens=0, adapters=1)
    assert with_lora == pytest.approx(one * (1 + model.lora_overhead))


def test_kv_usage_counts_whole_blocks() -> None:
    e = engine(R("r", prompt=BLOCK_SIZE + 1, out=2), blocks=10)
    e.step(0.0)
    assert e.kv_usage == pytest.approx(2 / 10)
