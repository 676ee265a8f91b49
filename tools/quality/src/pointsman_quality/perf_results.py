"""What inference-perf reports back: its per-request report read as
:class:`~pointsman_quality.live_stats.RequestResult` values, and the trace as the client really sent
it (inference-perf draws each request's model itself), for the virtual replay."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pointsman_quality.live_stats import RequestResult
from pointsman_quality.prompts import PROMPT_WORD_CHARS
from pointsman_sim.fleet import TraceRequest


def perf_results(entries: Iterable[Mapping[str, Any]]) -> list[RequestResult]:
    """inference-perf's ``per_request_lifecycle_metrics`` report (``computed_metrics`` on, ``request``
    on: each request's model and lengths come from the body it sent)."""
    results = []
    for entry in entries:
        body: Any = None
        request = entry.get("request")
        if isinstance(request, str):
            try:
                body = json.loads(request)
            except json.JSONDecodeError:
                body = None
        if not isinstance(body, dict):
            body = {}
        prompt = body.get("prompt")
        error = entry.get("error")
        metrics = entry.get("computed_metrics") or {}
        ttft = metrics.get("time_to_first_token")
        ok = error is None and ttft is not None
        results.append(
            RequestResult(
                ok=ok,
                start=float(entry["start_time"]),
                end=float(entry["end_time"]),
                ttft=ttft,
                tpot=metrics.get("time_per_output_token"),
                output_tokens=int(metrics.get("output_tokens") or 0),
                model=body.get("model") if isinstance(body.get("model"), str) else None,
                error=None if ok else _error_text(error) or "no tokens streamed",
                prompt_tokens=len(prompt) // PROMPT_WORD_CHARS if isinstance(prompt, str) else None,
                max_tokens=body.get("max_tokens") if isinstance(body.get("max_tokens"), int) else None,
            )
        )
    return results


def as_sent(
    trace: Sequence[TraceRequest], results: Sequence[RequestResult], base_model: str, window: int = 50
) -> tuple[list[TraceRequest], int]:
    """The trace with each request's model as the client really sent it (inference-perf draws each
    request's adapter itself, by ``lora_traffic_split``), so the virtual run replays exactly the
    live run's requests. Request i is matched to the i-th send with the same lengths (sends can swap
    places by a few); returns the trace and how many requests were matched."""
    sent = sorted(results, key=lambda r: r.start)
    used = [False] * len(sent)
    out = []
    matched = 0
    for i, request in enumerate(trace):
        found = None
        for j in range(max(0, i - window), min(len(sent), i + window + 1)):
            r = sent[j]
            if not used[j] and (r.prompt_tokens, r.max_tokens) == (request.prompt_tokens, request.max_tokens):
                found = j
                break
        if found is None or sent[found].model is None:
            out.append(request)
            continue
        used[found] = True
        matched += 1
        model = sent[found].model
        out.append(dataclasses.replace(request, adapter=None if model == base_model else model))
    return out, matched


def _error_text(error: Any) -> str | None:
    if isinstance(error, Mapping):
        return f"{error.get('error_type')}: {str(error.get('error_msg'))[:200]}"
    return None if error is None else str(error)[:200]
