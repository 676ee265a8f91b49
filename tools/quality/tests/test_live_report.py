"""The live bench's Markdown report."""

from __future__ import annotations

from quality_builders import stats

from pointsman_quality.agreement import agreement
from pointsman_quality.live_report import markdown
from pointsman_quality.live_stats import LiveStats
from pointsman_shared.stats import PERCENTILE_RULE_TEXT


def test_markdown_shows_the_agreement_and_every_run() -> None:
    virtual = stats(ttft_p50_s=0.5, ttft_p90_s=2.0, adapter_loads_disk=3, max_pod_share=0.3)
    seen = LiveStats(1.0, 10, 10, 0, 0.55, 2.1, 3.0, 0.1, 5.0, 100.0)
    run = {
        "kind": "pointsman",
        "virtual_contender": "pointsman-423",
        "required": True,
        "client": "inference-perf",
        "live": seen.as_dict(),
        "virtual": virtual.as_dict(),
        "virtual_range": {"ttft_p50_s": [0.45, 0.55], "ttft_p90_s": [1.9, 2.2]},
        "agreement": agreement(seen, virtual),
        "cpu": {"ours_cores": 0.6, "machine_cores": 0.7, "disturbed": False},
        "own_load": 0.5,
        "prefix_cache": {"hit_rate": 0.61, "hit_rate_with_warmup": 0.5},
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
            {
                "level": 0.5,
                "contenders": {
                    "pointsman-423": run,
                    "envoy-round-robin": {"error": "boom"},
                    # A router without a virtual twin: live figures only.
                    "vllm-router-cache-aware": {
                        "kind": "vllm-router",
                        "virtual_contender": "",
                        "required": False,
                        "live": seen.as_dict(),
                        "prefix_cache": {"hit_rate": 0.4, "hit_rate_with_warmup": None},
                    },
                },
            }
        ],
        "notes": ["a note"],
    }
    text = markdown(result)
    assert (
        "| 0.5 | pointsman-423 | 0.5 | pointsman-423 | 550 / 500 | 1.10 | 2,100 / 2,000 | 1.05 | no / yes |"
        in text
    )
    assert "| 0.5 | pointsman-423 | 550 | 1.00 | 2,000 | 1.05 |" in text  # snapshots every 75 ms
    assert "| 0.5 | envoy-round-robin | failed: boom |" in text
    assert "| 0.5 | pointsman-423 | 0.61 | 0.50 | 0.00 | 550 / 2,100 / 3,000 | 100 |" in text  # hit rates
    assert "| 0.5 | vllm-router-cache-aware | 0.40 | - | - | 550 / 2,100 / 3,000 | 100 |" in text
    assert "| 0.5 | vllm-router-cache-aware | inference-perf" not in text  # no client: "-"
    assert "- a note" in text
    assert f"- {PERCENTILE_RULE_TEXT}" in text  # which percentiles these are
