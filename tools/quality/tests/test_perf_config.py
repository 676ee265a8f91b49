"""What inference-perf is given: the trace CSV, the LoRA traffic split, the config."""

from __future__ import annotations

import csv
import math
from datetime import datetime

import pytest
from quality_builders import lora_scenario

from pointsman_quality.perf_config import azure_trace, lora_traffic_split, perf_config
from pointsman_quality.workload import ModelMix
from pointsman_sim.fleet import TraceRequest


def test_the_trace_csv_gives_inference_perf_each_requests_time_and_lengths() -> None:
    trace = [
        TraceRequest(0.25, 10, 20, "a"),
        TraceRequest(1.5000004, 300, 4),
        TraceRequest(61.75, 7, 1024, "b"),
    ]
    text = azure_trace(trace)
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
        sc = lora_scenario(**extra)
        split = lora_traffic_split(sc)
        values = [s["split"] for s in split]
        assert sum(values) == 1.0  # 3.11's plain sum
        assert math.fsum(values) == 1.0  # what 3.12's compensated sum gives
        mix = ModelMix.of(sc.traffic)
        total = sum(mix.weights)
        assert values == pytest.approx([w / total for w in mix.weights], abs=1e-5)
    assert split[0]["name"] == sc.traffic.base_model  # the base model, for baseShare
    assert [s["name"] for s in lora_traffic_split(lora_scenario())][:2] == ["hot-0", "hot-1"]


def test_perf_config_replays_the_trace_streams_and_reports_each_request() -> None:
    split = lora_traffic_split(lora_scenario())
    config = perf_config(
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
