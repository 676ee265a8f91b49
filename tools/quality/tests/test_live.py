"""The live bench's pure pieces (``pointsman_quality.live``) and its builtin client (``bench/
live_client.py``) against a real simulator pod on port 0. No network, no processes."""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import json
import math
import random
import sys
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import pytest

from pointsman_quality import live
from pointsman_quality.contenders import Contender
from pointsman_quality.runs import RunStats
from pointsman_quality.scenario import Scenario, ScenarioError, engine_configs, parse_scenario
from pointsman_quality.workload import ModelMix
from pointsman_sim.__main__ import build_parser, pod_specs
from pointsman_sim.engine import EngineConfig, LoraLoadModel, StepTimeModel
from pointsman_sim.fleet import RoundRobin, TraceRequest, run_fleet
from pointsman_sim.pod import PodSpec, SimPod
from pointsman_sim.servers import bind, pod_server
from pointsman_sim.traces import sharegpt_like

BENCH = Path(__file__).resolve().parents[3] / "bench"


def scenario(**extra: object) -> Scenario:
    doc = {
        "name": "live-test",
        "seed": 3,
        "fleet": {"pods": 4, "engine": {"maxLoras": 4}},
        "traffic": {
            "adapters": [
                {"prefix": "hot", "count": 5, "share": 0.6},
                {"prefix": "warm", "count": 5, "share": 0.3},
                {"prefix": "cold", "count": 5, "share": 0.1},
            ]
        },
        **extra,
    }
    return parse_scenario(doc)


# -- time scaling ---------------------------------------------------------------------------------
def test_time_scaled_engine_takes_k_times_as_long_for_every_step_and_load() -> None:
    base = EngineConfig(
        chunked_prefill=False,
        step_time=StepTimeModel(prefill_min_ms=40.0, prefill_fixed_ms=19.7, lora_overhead=0.5),
        lora_load=LoraLoadModel(rank=32),
    )
    k = 7.5
    scaled = live.time_scaled(base, k)
    rng = random.Random(1)
    for _ in range(50):
        shape = {
            "decoding": rng.randrange(300),
            "kv_tokens": rng.randrange(100_000),
            "prefill_tokens": rng.randrange(8192),
            "adapters": rng.randrange(5),
        }
        assert scaled.step_time.step_seconds(**shape) == pytest.approx(
            k * base.step_time.step_seconds(**shape)
        )
        prefill = {"prefill_tokens": shape["prefill_tokens"], "adapters": shape["adapters"]}
        assert scaled.step_time.prefill_step_seconds(**prefill) == pytest.approx(
            k * base.step_time.prefill_step_seconds(**prefill)
        )
    for from_disk in (True, False):
        assert scaled.lora_load.seconds(from_disk=from_disk) == pytest.approx(
            k * base.lora_load.seconds(from_disk=from_disk)
        )
    # Nothing but time changes: capacities, the LoRA factors and the rank stay.
    unchanged = dataclasses.replace(scaled, step_time=base.step_time, lora_load=base.lora_load)
    assert unchanged == base
    assert scaled.lora_load.rank == 32
    assert scaled.step_time.lora_overhead == 0.5
    with pytest.raises(ValueError, match="positive"):
        live.time_scaled(base, 0)


def test_a_k_times_slower_fleet_at_a_k_times_slower_trace_is_the_same_run_in_k_times_the_time() -> None:
    k = 4.0
    trace = sharegpt_like(random.Random(5), 60, rate=30.0, adapters=(None, "a", "b"))
    slow = [dataclasses.replace(r, arrival=r.arrival * k) for r in trace]
    configs = [EngineConfig(max_loras=2)] * 2
    fast_run = run_fleet(configs, trace, RoundRobin())
    slow_run = run_fleet([live.time_scaled(c, k) for c in configs], slow, RoundRobin())
    fast = {s.request.request_id: s.request.time_to_first_token for s in fast_run.served}
    slowed = {s.request.request_id: s.request.time_to_first_token for s in slow_run.served}
    assert slowed.keys() == fast.keys()
    for request_id, ttft in fast.items():
        assert slowed[request_id] == pytest.approx(k * ttft)


# -- the live fleet -------------------------------------------------------------------------------
def test_the_pods_the_sim_flags_start_run_exactly_the_scenarios_engine() -> None:
    sc = scenario(fleet={"pods": 4, "engine": {"maxLoras": 3, "maxCpuLoras": 6, "numGpuBlocks": 5000}})
    engine = engine_configs(sc)[0]
    flags = live.sim_args(
        engine,
        profile=sc.fleet.profile,
        model=sc.traffic.base_model,
        adapters=["hot-0", "hot-1"],
        speedup=0.05,
    )
    spec = pod_specs(build_parser().parse_args(["--ports", "1", *flags]), [1])[0]
    assert spec.engine == engine
    assert (spec.speedup, spec.adapters, spec.model) == (0.05, ("hot-0", "hot-1"), sc.traffic.base_model)


def test_live_scenario_sets_the_pods_and_refuses_per_pod_engines() -> None:
    sc = scenario()
    assert live.live_scenario(sc) is sc
    assert live.live_scenario(sc, 2).fleet.pods == 2
    per_pod = scenario(fleet={"pods": 2, "perPod": [{"pods": [1], "maxLoras": 1}]})
    with pytest.raises(ScenarioError, match="one engine config"):
        live.live_scenario(per_pod)


# -- inference-perf -------------------------------------------------------------------------------
def test_the_trace_csv_gives_inference_perf_each_requests_time_and_lengths() -> None:
    trace = [
        TraceRequest(0.25, 10, 20, "a"),
        TraceRequest(1.5000004, 300, 4),
        TraceRequest(61.75, 7, 1024, "b"),
    ]
    text = live.azure_trace(trace)
    # inference-perf skips the first line only if csv.Sniffer says it is a header.
    assert csv.Sniffer().has_header(text[:2048])
    rows = list(csv.reader(text.splitlines()))[1:]
    assert [(int(r[1]), int(r[2])) for r in rows] == [(10, 20), (300, 4), (7, 1024)]
    # Its reader takes times relative to the first row, to the microsecond.
    stamps = [datetime.strptime(r[0], "%Y-%m-%d %H:%M:%S.%f") for r in rows]
    seconds = [(t - stamps[0]).total_seconds() for t in stamps]
    assert seconds == pytest.approx([0.0, 1.25, 61.5], abs=2e-6)


def test_lora_split_sums_to_exactly_one_however_python_adds() -> None:
    for extra in (
        {},
        {"traffic": {"baseShare": 0.3, "adapters": [{"prefix": "z", "count": 7, "share": 0.7}]}},
    ):
        sc = scenario(**extra)
        split = live.lora_traffic_split(sc)
        values = [s["split"] for s in split]
        assert sum(values) == 1.0  # 3.11's plain sum
        assert math.fsum(values) == 1.0  # what 3.12's compensated sum gives
        mix = ModelMix.of(sc.traffic)
        total = sum(mix.weights)
        assert values == pytest.approx([w / total for w in mix.weights], abs=1e-5)
    assert split[0]["name"] == sc.traffic.base_model  # the base model, for baseShare
    assert [s["name"] for s in live.lora_traffic_split(scenario())][:2] == ["hot-0", "hot-1"]


def test_perf_config_replays_the_trace_streams_and_reports_each_request() -> None:
    split = live.lora_traffic_split(scenario())
    config = live.perf_config(
        base_url="http://127.0.0.1:1",
        model="base",
        trace_file="/run/trace.csv",
        tokenizer_dir="/run/tokenizer",
        report_dir="/run/report",
        lora_split=split,
        duration=59.5,
        rate=11.2,
        seed=4,
        request_timeout=300,
    )
    assert config["api"] == {"type": "completion", "streaming": True}
    assert config["data"]["type"] == "random"
    assert config["data"]["trace"]["file"] == config["load"]["trace"]["file"] == "/run/trace.csv"
    assert config["load"]["type"] == "trace_replay"
    assert config["load"]["lora_traffic_split"] == split
    assert config["load"]["stages"] == [{"rate": 11.2, "duration": 60}]
    assert config["tokenizer"]["pretrained_model_name_or_path"] == "/run/tokenizer"
    assert config["server"] == {
        "type": "vllm",
        "model_name": "base",
        "base_url": "http://127.0.0.1:1",
        "ignore_eos": True,
    }
    per_request = config["report"]["request_lifecycle"]
    assert per_request["per_request"] is True
    assert per_request["per_request_fields"]["computed_metrics"] is True
    assert per_request["per_request_fields"]["request"] is True


def perf_entry(
    start: float, model: str, prompt_tokens: int, max_tokens: int, **metrics: object
) -> dict[str, object]:
    body = {
        "model": model,
        "prompt": live.prompt_text(prompt_tokens),
        "max_tokens": max_tokens,
        "stream": True,
    }
    return {
        "start_time": start,
        "end_time": start + 2.0,
        "request": json.dumps(body),
        "computed_metrics": {
            "time_to_first_token": 0.25,
            "time_per_output_token": 0.05,
            "output_tokens": max_tokens,
            **metrics,
        },
        "error": None,
    }


def test_perf_results_read_inference_perfs_per_request_report() -> None:
    failed = {
        "start_time": 9.0,
        "end_time": 9.5,
        "request": "{}",
        "error": {"error_type": "HTTP Error 503", "error_msg": "no healthy upstream"},
    }
    ok, bad = live.perf_results([perf_entry(1.0, "hot-1", 12, 30), failed])
    assert ok == live.RequestResult(True, 1.0, 3.0, 0.25, 0.05, 30, "hot-1", None, 12, 30)
    assert (bad.ok, bad.ttft, bad.error) == (False, None, "HTTP Error 503: no healthy upstream")


def test_as_sent_gives_the_virtual_replay_the_models_inference_perf_drew() -> None:
    trace = [
        TraceRequest(0.1, 10, 20, "hot-0"),
        TraceRequest(0.2, 11, 21, "hot-1"),
        TraceRequest(0.3, 12, 22),
    ]
    # The second and third sends swapped places; the first went out for the base model.
    results = live.perf_results(
        [
            perf_entry(5.0, "base", 10, 20),
            perf_entry(5.2, "cold-2", 12, 22),
            perf_entry(5.21, "warm-1", 11, 21),
        ]
    )
    replayed, matched = live.as_sent(trace, results, "base")
    assert matched == 3
    assert [r.adapter for r in replayed] == [None, "warm-1", "cold-2"]
    assert [(r.arrival, r.prompt_tokens, r.max_tokens) for r in replayed] == [
        (r.arrival, r.prompt_tokens, r.max_tokens) for r in trace
    ]


# -- statistics and agreement ---------------------------------------------------------------------
def test_live_stats_take_percentiles_as_the_virtual_runs_do_after_the_warmup() -> None:
    trace = [TraceRequest(1.0 + i, 1, 5) for i in range(14)]  # the first 2 arrive before 3 s
    results = [
        live.RequestResult(True, 100.0 + i, 110.0 + i, ttft=i / 10, tpot=0.01 * i, output_tokens=5)
        for i in range(12)
    ]
    results.append(live.RequestResult(False, 112.0, 113.0, error="HTTP 503"))
    stats = live.live_stats(2.0, trace, results, since=3.0)
    # Counted: arrivals 3..14 s (12 requests): sends 102..111 ok, 112 failed, one never reported.
    assert (stats.requests, stats.finished, stats.failed) == (12, 10, 2)
    assert stats.ttft_p50_s == pytest.approx(0.6)  # nearest rank: the 5th of 0.2 .. 1.1
    assert stats.ttft_p90_s == pytest.approx(1.0)
    assert stats.ttft_p99_s == pytest.approx(1.1)
    assert stats.e2e_p90_s == pytest.approx(10.0)
    assert stats.tokens_per_s == pytest.approx(50 / (121.0 - 102.0))
    assert live.live_stats(2.0, trace, results).finished == 12
    # Every request reported: the k-th send is the k-th arrival, however early it went out.
    early = [dataclasses.replace(r, start=r.start - 0.2) if i == 2 else r for i, r in enumerate(results)]
    early.append(live.RequestResult(True, 113.0, 114.0, ttft=0.1, tpot=0.01, output_tokens=5))
    counted = live.live_stats(2.0, trace, early, since=3.0)
    assert (counted.requests, counted.finished) == (12, 11)


def test_send_lag_is_each_send_against_its_arrival_after_the_first() -> None:
    trace = [TraceRequest(0.5 + 0.1 * i, 1, 1) for i in range(10)]
    results = [
        live.RequestResult(True, 100.0 + 0.1 * i + (0.02 if i == 9 else 0.0), 101.0) for i in range(10)
    ]
    lag = live.send_lag(trace, results)
    assert lag["p50"] == pytest.approx(0.0, abs=1e-6)
    assert lag["max"] == pytest.approx(20.0)
    assert live.send_lag(trace, results[:3]) == {}


def run_stats(**values: float) -> RunStats:
    base = dict.fromkeys(RunStats.__dataclass_fields__, 1.0)
    return RunStats(**{**base, **values})  # type: ignore[arg-type]


def test_agreement_is_live_over_virtual_and_needs_both_ttft_percentiles_within_the_tolerance() -> None:
    virtual = run_stats(ttft_p50_s=0.5, ttft_p90_s=2.0)
    close = live.agreement({**virtual.as_dict(), "ttft_p50_s": 0.59, "ttft_p90_s": 1.62}, virtual)
    assert close["ratios"]["ttft_p50_s"] == pytest.approx(1.18)
    assert close["ratios"]["ttft_p90_s"] == pytest.approx(0.81)
    assert close["agrees"]
    far = live.agreement({**virtual.as_dict(), "ttft_p50_s": 0.5, "ttft_p90_s": 2.5}, virtual)
    assert not far["agrees"]  # p90 is 25% off
    zero = live.agreement(virtual.as_dict(), run_stats(ttft_p50_s=0.0))
    assert zero["ratios"]["ttft_p50_s"] is None
    assert not zero["agrees"]


def test_median_stats_and_virtual_run_over_a_given_trace_after_the_warmup() -> None:
    sc = scenario()
    engines = [live.time_scaled(EngineConfig(max_loras=4), 5.0)] * 4
    trace = [TraceRequest(0.2 * i, 50, 10, f"hot-{i % 5}") for i in range(30)]
    runs = [
        live.virtual_run(sc, Contender("round-robin", None), engines, trace, 5.0, seed) for seed in range(3)
    ]
    assert all(r.requests == r.finished == 30 for r in runs)
    median = live.median_stats(runs)
    assert median["ttft_p50_s"] == sorted(r.ttft_p50_s for r in runs)[1]
    one_adapter = [dataclasses.replace(r, adapter="hot-0") for r in trace]
    rr = Contender("round-robin", None)
    whole = live.virtual_run(sc, rr, engines, one_adapter, 5.0)
    later = live.virtual_run(sc, rr, engines, one_adapter, 5.0, since=2.0)
    assert later.requests == later.finished == 20
    # The first request on each pod pays the adapter's load from disk (5 x slower); later ones do not.
    assert later.ttft_p90_s < whole.ttft_p90_s
    assert later.adapter_loads_disk == whole.adapter_loads_disk == 4  # the whole run's


# -- the builtin client ---------------------------------------------------------------------------
def test_sse_stream_counts_text_events_across_any_split() -> None:
    events = [
        {"choices": [{"text": " the"}]},
        {"choices": [{"text": " model"}]},
        {"choices": [], "usage": {"completion_tokens": 2}},
    ]
    raw = b"".join(b"data: " + json.dumps(e).encode() + b"\r\n\r\n" for e in events) + b"data: [DONE]\n\n"
    for cut in range(1, len(raw), 7):
        stream = live.SseStream()
        counts = [stream.feed(raw[i : i + cut]) for i in range(0, len(raw), cut)]
        assert sum(counts) == 2
        assert stream.done
        assert stream.output_tokens == 2
    broken = live.SseStream()
    assert broken.feed(b'data: {"error": {"message": "pod stopped"}}\n\n') == 0
    assert broken.error == "pod stopped"


def test_prompts_are_four_characters_a_token() -> None:
    assert live.prompt_text(3) == " 000 001 002"
    assert len(live.prompt_text(250, offset=990)) == 1000


@pytest.fixture
async def pod_url() -> AsyncIterator[str]:
    sock = bind("127.0.0.1", 0)
    address = f"127.0.0.1:{sock.getsockname()[1]}"
    spec = PodSpec(name=address, adapters=("hot-0",), engine=EngineConfig(max_loras=1), speedup=20.0)
    async with SimPod(spec) as pod:
        server = pod_server(pod)
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        yield f"http://{address}"
        server.should_exit = True
        await serving


async def test_builtin_client_measures_ttft_from_the_first_streamed_token_of_a_real_pod(pod_url: str) -> None:
    sys.path.insert(0, str(BENCH))
    try:
        from live_client import LiveRequest, replay  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(BENCH))
    requests = [
        LiveRequest(0.0, "hot-0", 40, 12),
        LiveRequest(0.05, "meta-llama/Llama-3.1-8B-Instruct", 8, 3),
    ]
    requests.append(LiveRequest(0.1, "no-such-adapter", 8, 3))
    results = await replay(pod_url, requests, request_timeout=10, run_timeout=20)
    first, second, missing = results
    assert first.ok
    assert second.ok
    assert (first.output_tokens, second.output_tokens) == (12, 3)
    assert first.ttft is not None
    assert first.tpot is not None
    # The first token waits for the adapter load and the prompt; the rest come a step apart, then the
    # usage event and [DONE] end the body.
    assert 0 < first.ttft < first.e2e
    assert first.tpot > 0
    assert first.ttft + 11 * first.tpot <= first.e2e < first.ttft + 11 * first.tpot + 0.05
    assert not missing.ok
    assert missing.error is not None
    assert missing.error.startswith("HTTP 404")


def test_markdown_shows_the_agreement_and_every_run() -> None:
    virtual = run_stats(ttft_p50_s=0.5, ttft_p90_s=2.0, adapter_loads_disk=3, max_pod_share=0.3)
    stats = live.LiveStats(1.0, 10, 10, 0, 0.55, 2.1, 3.0, 0.1, 5.0, 100.0)
    run = {
        "kind": "pointsman",
        "virtual_contender": "pointsman-423",
        "required": True,
        "client": "inference-perf",
        "live": stats.as_dict(),
        "virtual": virtual.as_dict(),
        "virtual_range": {"ttft_p50_s": [0.45, 0.55], "ttft_p90_s": [1.9, 2.2]},
        "agreement": live.agreement(stats, virtual),
        "cpu": {"ours_cores": 0.6, "machine_cores": 0.7, "disturbed": False},
        "own_load": 0.5,
        "in_seed_range": {"ttft_p50_s": False, "ttft_p90_s": True},
        "virtual_stale": {
            "snapshot_interval_s": 0.075,
            "ttft_p50_s": 0.55,
            "ttft_p90_s": 2.0,
            "ratios": {"ttft_p50_s": 1.0, "ttft_p90_s": 1.05},
        },
    }
    result = {
        "scenario": "multi-lora",
        "variant": "",
        "client": "inference-perf",
        "client_note": "why",
        "setup": {
            "time_scale": 20.0,
            "pods": 8,
            "duration_s": 60.0,
            "reference": "pointsman-423",
            "capacity_rps": 450.0,
            "capacity_source": "virtual search",
            "virtual_seeds": 5,
            "required": "p50 and p90",
        },
        "machine": {"note": "2 cores. Not disturbed."},
        "levels": [
            {"level": 0.5, "contenders": {"pointsman-423": run, "envoy-round-robin": {"error": "boom"}}}
        ],
        "notes": ["a note"],
    }
    text = live.markdown(result)
    assert (
        "| 0.5 | pointsman-423 | 0.5 | pointsman-423 | 550 / 500 | 1.10 | 2,100 / 2,000 | 1.05 | no / yes |"
        in text
    )
    assert "| 0.5 | pointsman-423 | 550 | 1.00 | 2,000 | 1.05 |" in text  # snapshots every 75 ms
    assert "| 0.5 | envoy-round-robin | failed: boom |" in text
    assert "- a note" in text
