"""What inference-perf is given: the trace as the CSV its ``trace_replay`` load replays, the
``lora_traffic_split`` of the scenario's model mix, and its config file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pointsman_quality.scenario import Scenario
from pointsman_quality.workload import ModelMix
from pointsman_sim.fleet import TraceRequest

_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def azure_trace(trace: Sequence[TraceRequest]) -> str:
    """The trace as the Azure public dataset's CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``), which
    inference-perf replays: its ``trace_replay`` load sends request i at the i-th timestamp (relative to
    the first) and its ``random`` data with ``trace`` gives request i those lengths."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for request in trace:
        stamp = (_EPOCH + timedelta(seconds=request.arrival)).strftime("%Y-%m-%d %H:%M:%S.%f")
        lines.append(f"{stamp},{request.prompt_tokens},{request.max_tokens}")
    return "\n".join(lines) + "\n"


def lora_traffic_split(scenario: Scenario) -> list[dict[str, Any]]:
    """inference-perf's ``load.lora_traffic_split`` for the scenario's model mix: each adapter (and the
    base model, for ``baseShare``) with its share. inference-perf insists the splits sum to exactly
    1.0, and Python 3.12's ``sum`` of floats is compensated (3.11's is not): so every split is a
    multiple of 2**-20 (any sum of them is exact), the last one taking what the others leave."""
    mix = ModelMix.of(scenario.traffic)
    total = sum(mix.weights)
    names = [name or scenario.traffic.base_model for name in mix.names]
    splits = [round(weight / total * _SPLIT_UNIT) / _SPLIT_UNIT for weight in mix.weights[:-1]]
    last = 1.0 - sum(splits)
    if last <= 0:
        raise ValueError(f"cannot split the traffic: {mix.weights}")
    return [{"name": name, "split": split} for name, split in zip(names, [*splits, last], strict=True)]


_SPLIT_UNIT = float(1 << 20)


def perf_config(
    *,
    base_url: str,
    model: str,
    trace_file: str,
    tokenizer_dir: str,
    report_dir: str,
    lora_split: list[dict[str, Any]],
    duration: float,
    rate: float,
    seed: int,
    request_timeout: float,
    max_in_flight: int = 4000,
) -> dict[str, Any]:
    """inference-perf's config: stream completions, replay ``trace_file`` (arrivals and lengths), each
    request's model drawn by ``lora_traffic_split``, a per-request report in ``report_dir``.

    One worker process (two cores: the client must leave room for the stack) whose concurrency cap is
    far above what the run keeps in flight, so the load stays open-loop: inference-perf takes a slot
    when it schedules a request, before its send time.
    """
    return {
        "api": {"type": "completion", "streaming": True},
        "data": {"type": "random", "trace": {"file": trace_file, "format": "AzurePublicDataset"}},
        "load": {
            "type": "trace_replay",
            "trace": {"file": trace_file, "format": "AzurePublicDataset"},
            # With a trace the stage sends the trace's requests at the trace's times; rate and
            # duration only label the stage.
            "stages": [{"rate": rate, "duration": max(1, math.ceil(duration))}],
            "num_workers": 1,
            "worker_max_concurrency": max_in_flight,
            "worker_max_tcp_connections": max_in_flight,
            "lora_traffic_split": lora_split,
            "base_seed": seed,
            "request_timeout": request_timeout,
            "stage_teardown_grace_seconds": 5.0,
        },
        "server": {"type": "vllm", "model_name": model, "base_url": base_url, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": tokenizer_dir, "load_timeout": 60.0},
        "storage": {"local_storage": {"path": report_dir}},
        "report": {
            "request_lifecycle": {
                "summary": True,
                "per_stage": False,
                "per_request": True,
                "per_adapter": False,
                "per_request_fields": {
                    "request": True,
                    "response": False,
                    "info": False,
                    "response_chunks": False,
                    "computed_metrics": True,
                },
            },
            "prometheus": None,
        },
    }
