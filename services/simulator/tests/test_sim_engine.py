from __future__ import annotations

import contextlib
import dataclasses
import random
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman_sim.engine import BLOCK_SIZE, Engine, EngineConfig, RequestRejected, StepTimeModel
from pointsman_sim.prefix import Span, spans_block_hashes


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


def v0_engine(*requests: R, blocks: int = 1000) -> Engine:
    config = EngineConfig(
        num_gpu_blocks=blocks, max_num_seqs=8, max_loras=2, chunked_prefill=False, max_num_batched_tokens=4096
    )
    e = Engine(config)
    submit(e, *requests)
    return e


def test_chunked_prefill_splits_a_long_prompt_and_keeps_decodes_going() -> None:
    e = Engine(EngineConfig(max_num_batched_tokens=100))
    submit(e, R("short", prompt=10, out=10))
    now = e.step(0.0).ends_at
    submit(e, R("long", prompt=250, out=2), now=now)
    firsts = []
    while "long" not in (result := e.step(now)).tokens:
        assert "short" in result.tokens  # decoding goes on beside the prompt's chunks
        firsts.append(result)
        now = result.ends_at
    assert len(firsts) == 2  # 99 + 99 tokens, then the last 52 and the first token


def test_v0_scheduler_runs_prefill_steps_apart_from_decode_steps() -> None:
    e = v0_engine(R("first", prompt=10, out=10))
    now = e.step(0.0).ends_at
    submit(e, R("second", prompt=10, out=10), now=now)
    prefill = e.step(now)
    assert set(prefill.tokens) == {"second"}  # "first" does not decode in a prefill step
    assert prefill.duration == pytest.approx(
        StepTimeModel().prefill_step_seconds(prefill_tokens=10, adapters=0)
    )
    assert set(e.step(prefill.ends_at).tokens) == {"first", "second"}


def test_v0_prefill_step_has_a_floor() -> None:
    model = StepTimeModel(prefill_min_ms=40.0, prefill_fixed_ms=19.7, prefill_tokens_per_s=14_800)
    assert model.prefill_step_seconds(prefill_tokens=10, adapters=0) == pytest.approx(0.040)
    assert model.prefill_step_seconds(prefill_tokens=2000, adapters=0) * 1000 == pytest.approx(154.8, abs=0.1)


def test_v0_rejects_a_request_longer_than_the_token_budget() -> None:
    with pytest.raises(RequestRejected):
        v0_engine(R("r", prompt=4000, out=200))


def lora_engine(max_loras: int, max_cpu_loras: int | None) -> Engine:
    return Engine(EngineConfig(max_loras=max_loras, max_cpu_loras=max_cpu_loras))


def run_one(e: Engine, request: R, now: float) -> float:
    """Run a request alone to the end; return when it ended."""
    submit(e, request, now=now)
    return run_to_end(e, now)


@pytest.mark.parametrize(
    ("max_loras", "max_cpu_loras", "adapters", "disk", "cpu", "evictions", "cpu_evictions"),
    [
        pytest.param(1, 1, "abab", 4, 0, 3, 3, id="one-slot-one-cpu-every-switch-from-disk"),
        pytest.param(1, 2, "abab", 2, 2, 3, 0, id="cpu-cache-serves-the-return"),
        pytest.param(2, 2, "abab", 2, 0, 0, 0, id="both-stay-resident"),
        pytest.param(2, 3, "abcab", 3, 2, 3, 0, id="lru-idle-adapter-evicted"),
    ],
)
def test_counts_adapter_loads_and_evictions(
    max_loras: int, max_cpu_loras: int, adapters: str, disk: int, cpu: int, evictions: int, cpu_evictions: int
) -> None:
    e = lora_engine(max_loras, max_cpu_loras)
    now = 0.0
    for i, adapter in enumerate(adapters):
        now = run_one(e, R(f"r{i}", adapter=adapter), now)
    totals = e.totals()
    assert (totals.lora_loads_from_disk, totals.lora_loads_from_cpu) == (disk, cpu)
    assert (totals.lora_evictions, totals.lora_cpu_evictions) == (evictions, cpu_evictions)
    assert len(e.gpu_adapters) <= max_loras
    assert e.gpu_adapters <= e.cpu_adapters


@pytest.mark.parametrize(
    ("warm", "extra_ms"),
    [
        pytest.param(None, 57 + 2.9 * 16 + 9, id="from-disk"),
        pytest.param("b", 9.0, id="from-cpu-cache"),
    ],
)
def test_adapter_load_lengthens_the_admitting_step(warm: str | None, extra_ms: float) -> None:
    e = lora_engine(1, 2)
    now = 0.0
    if warm:  # load a, then b (a moves to the CPU cache only)
        now = run_one(e, R("w1", adapter="a"), now)
        now = run_one(e, R("w2", adapter=warm), now)
    submit(e, R("r", adapter="a", out=2), now=now)
    loading = e.step(now)
    plain = e.config.step_time.step_seconds(decoding=0, kv_tokens=16, prefill_tokens=16, adapters=1)
    assert (loading.duration - plain) * 1000 == pytest.approx(extra_ms)


def test_unload_adapter_only_when_idle() -> None:
    e = lora_engine(1, 1)
    submit(e, R("r", adapter="a", out=3))
    e.step(0.0)
    assert not e.unload_adapter("a")
    run_to_end(e)
    assert e.unload_adapter("a")
    assert e.gpu_adapters == frozenset() == e.cpu_adapters


def test_later_tokens_count_only_tokens_after_a_first() -> None:
    e = engine(R("r1", out=3))
    first = e.step(0.0)
    submit(e, R("r2", out=3), now=first.ends_at)
    second = e.step(first.ends_at)
    assert (first.later_tokens, len(second.tokens), second.later_tokens) == (0, 2, 1)


def test_skipped_requests_keep_their_order_when_the_scan_stops_early() -> None:
    e = engine(R("a1", out=50, adapter="a"), max_loras=1)
    now = e.step(0.0).ends_at
    submit(e, R("b1", adapter="b"), R("base"), R("c1", adapter="c"), R("b2", adapter="b"), now=now)
    assert "base" in e.step(now).tokens
    assert [r.request_id for r in e._waiting] == ["b1", "c1", "b2"]


@pytest.mark.parametrize("chunked", [True, False], ids=["v1", "v0"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_invariants_hold_under_random_load(chunked: bool, seed: int) -> None:
    # A small cache and many adapters: preemptions, skips, loads and evictions all happen.
    rng = random.Random(seed)
    config = EngineConfig(
        num_gpu_blocks=30,
        max_num_seqs=6,
        max_num_batched_tokens=256,
        chunked_prefill=chunked,
        max_loras=2,
        max_cpu_loras=3,
    )
    e = Engine(config)
    outputs: dict[str, int] = {}
    finished: dict[str, int] = {}
    now = 0.0
    for i in range(120):
        outputs[f"r{i}"] = rng.randint(1, 60)
        e.submit(f"r{i}", rng.randint(1, 120), outputs[f"r{i}"], rng.choice([None, "a", "b", "c", "d"]), now)
        steps = rng.randint(0, 3) if i < 119 else 100_000
        for _ in range(steps):
            if not e.has_work:
                break
            result = e.step(now)
            now = result.ends_at
            finished |= {f.request_id: f.output_tokens for f in result.finished}
            assert len(e.running_adapters) <= config.max_loras
            assert e.running_adapters <= e.gpu_adapters <= e.cpu_adapters
            assert len(e.cpu_adapters) <= config.cpu_lora_capacity
            assert 0.0 <= e.kv_usage <= 1.0
            assert e.running_count <= config.max_num_seqs
    assert finished == outputs
    totals = e.totals()
    assert (totals.finished, totals.generation_tokens) == (len(outputs), sum(outputs.values()))
    assert totals.preemptions > 0
    assert totals.lora_evictions > 0
    assert e.kv_usage == 0.0


# -- automatic prefix caching ----------------------------------------------------------------------


def hashed(tokens: int, seed: int = 0, adapter: str | None = None) -> tuple[int, ...]:
    return spans_block_hashes((Span(seed, tokens),), adapter, BLOCK_SIZE)


def ttft_of(e: Engine, request_id: str, prompt: int, hashes: tuple[int, ...], now: float) -> float:
    e.submit(request_id, prompt, 4, None, now, hashes)
    while e.has_work:
        result = e.step(now)
        now = result.ends_at
        for finished in result.finished:
            return finished.time_to_first_token
    raise AssertionError("no request finished")


@pytest.mark.parametrize(
    ("caching", "second", "hit_tokens"),
    [
        pytest.param(True, hashed(2048), 2032, id="same-prompt: all but the last block"),
        pytest.param(True, hashed(2048)[:64] + hashed(1024, seed=5)[:64], 1024, id="shared-half"),
        pytest.param(True, hashed(2048, seed=1), 0, id="other-prompt"),
        pytest.param(True, hashed(2048, adapter="a"), 0, id="same-text-for-an-adapter"),
        pytest.param(True, (), 0, id="no-hashes"),
        pytest.param(False, hashed(2048), 0, id="caching-off"),
    ],
)
def test_a_prompt_sent_again_skips_its_cached_prefix(
    caching: bool, second: tuple[int, ...], hit_tokens: int
) -> None:
    e = Engine(EngineConfig(enable_prefix_caching=caching))
    first = ttft_of(e, "r1", 2048, hashed(2048), 0.0)
    again = ttft_of(e, "r2", 2048, second, 10.0)
    totals = e.totals()
    assert (totals.prefix_cache_queries, totals.prefix_cache_hits) == (
        (4096, hit_tokens) if caching else (0, 0)
    )
    assert totals.prompt_tokens == 4096  # cached tokens are prompt tokens still, as vLLM counts them
    if hit_tokens:
        assert again < first
    else:
        assert again == pytest.approx(first)
    assert e.prefix_cache_hit_rate == (hit_tokens / 4096 if caching else None)


def test_a_finished_requests_blocks_stay_cached_until_the_space_is_needed() -> None:
    # 200 blocks; each request holds 100 (99 full prompt blocks, cached, and its last one). The second
    # takes uncached free blocks; the third finds 2 and reuses 98 of the first's cached ones, the
    # least recently freed: the first's from its last block back, so its first block is still there.
    e = Engine(EngineConfig(num_gpu_blocks=200))
    for i, seed in enumerate((1, 2, 3)):
        ttft_of(e, f"r{i}", 1590, hashed(1590, seed), 10.0 * i)
    assert e.kv_usage == 0.0  # cached blocks no request holds count as free, as vLLM's usage does
    assert e.cached_prefix_blocks(hashed(1590, 3)) == 99
    assert e.cached_prefix_blocks(hashed(1590, 2)) == 99
    assert e.cached_prefix_blocks(hashed(1590, 1)) == 1


@pytest.mark.parametrize("chunked", [True, False], ids=["v1", "v0"])
def test_requests_without_hashes_run_exactly_as_without_caching(chunked: bool) -> None:
    # The prefix cache changes nothing for traffic whose prompts share no blocks: today's figures stand.
    def finished(caching: bool) -> list[object]:
        rng = random.Random(5)
        config = EngineConfig(
            num_gpu_blocks=40,
            max_num_batched_tokens=256,
            chunked_prefill=chunked,
            enable_prefix_caching=caching,
        )
        e, now, done = Engine(config), 0.0, []
        for i in range(150):
            e.submit(f"r{i}", rng.randint(1, 120), rng.randint(1, 60), rng.choice([None, "a", "b"]), now)
            for _ in range(rng.randint(0, 3) if i < 149 else 100_000):
                if not e.has_work:
                    break
                result = e.step(now)
                now = result.ends_at
                done += result.finished
        return [done, dataclasses.replace(e.totals(), prefix_cache_queries=0)]

    assert finished(True) == finished(False)


def check_blocks(e: Engine) -> None:
    """No block counted twice, the capacity never exceeded, only free blocks evictable."""
    cache = e._cache
    assert cache is not None
    running = list(e._running.values())
    holders = Counter(h for r in running for h in r.cached)
    assert all(len(set(r.cached)) == len(r.cached) for r in running)  # no request holds a block twice
    assert holders == Counter(cache._in_use)  # every held block counted once per holder, no other
    assert not set(cache._in_use) & set(cache._free)  # a block is in use or free, never both
    used = sum(r.blocks - len(r.cached) for r in running) + len(cache._in_use)
    assert used + e._free_blocks == e.config.num_gpu_blocks
    assert 0 <= cache.free_count <= e._free_blocks  # the cache's free blocks are among the free ones
    assert all(r.blocks == 0 and not r.cached for r in e._waiting)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # system prompt
            st.integers(0, 120),  # its length
            st.integers(1, 80),  # question length
            st.integers(1, 40),  # output
            st.sampled_from([None, "a", "b"]),
            st.integers(0, 3),  # steps before the next arrival
        ),
        min_size=1,
        max_size=40,
    ),
    st.booleans(),
)
def test_the_block_cache_keeps_its_books_under_any_load(
    requests: list[tuple[int, int, int, int, str | None, int]], chunked: bool
) -> None:
    config = EngineConfig(
        num_gpu_blocks=24, max_num_seqs=5, max_num_batched_tokens=128, chunked_prefill=chunked, max_loras=2
    )
    e, now, finished = Engine(config), 0.0, set()
    for i, (system, length, question, output, adapter, steps) in enumerate(requests):
        spans = (Span(system, length), Span(1000 + i, question))
        hashes = spans_block_hashes(spans, adapter, BLOCK_SIZE)
        with contextlib.suppress(RequestRejected):  # too long for one step without chunked prefill
            e.submit(f"r{i}", length + question, output, adapter, now, hashes)
        for _ in range(steps if i < len(requests) - 1 else 100_000):
            if not e.has_work:
                break
            result = e.step(now)
            now = result.ends_at
            finished |= {f.request_id for f in result.finished}
            check_blocks(e)
    assert not e.has_work
    totals = e.totals()
    assert totals.finished == len(finished)
    assert 0 <= totals.prefix_cache_hits <= totals.prefix_cache_queries
