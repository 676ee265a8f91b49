"""The pure pieces of the live routing-quality bench (``bench/live.py``, ``make bench-live``).

The live bench runs a scenario through the real stack (simulator pods, collector, picker, Envoy; or
Envoy and vllm-router without the picker) and the same scenario through the virtual-time fleet driver,
and compares the two. What is here has no processes and no I/O:

- **time scaling.** Two cores cannot run a fleet at its real speed, so the live pods run ``k`` times
  slower (``pointsman-sim --speedup 1/k``) at ``1/k`` of the arrival rate. The virtual run uses the
  same scaled engine (:func:`time_scaled`: every step and adapter-load constant ``k`` times longer),
  so both measure the same system, in the same (wall) seconds.
- the pods' flags (:func:`sim_args`), the trace as inference-perf's trace-replay CSV
  (:func:`azure_trace`), its ``lora_traffic_split`` (:func:`lora_traffic_split`) and config
  (:func:`perf_config`), its per-request report read back (:func:`perf_results`);
- the builtin client's SSE parsing (:class:`SseStream`) and prompts (:func:`prompt_text`);
- the statistics of a live run (:func:`live_stats`, same percentiles as the virtual runs) and the
  live-vs-virtual agreement (:func:`agreement`); the report (:func:`markdown`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pointsman_quality.contenders import Contender
from pointsman_quality.runs import RunStats, percentile
from pointsman_quality.scenario import Scenario, ScenarioError
from pointsman_quality.workload import ModelMix
from pointsman_sim.engine import EngineConfig
from pointsman_sim.fleet import DEFAULT_SNAPSHOT_INTERVAL, FleetResult, TraceRequest, run_fleet

# -- time scaling ---------------------------------------------------------------------------------
# Constants in milliseconds: k times longer. prefill_tokens_per_s is a rate: k times smaller. The LoRA
# overhead factors (alpha, beta) and the adapter rank multiply durations, so they stay.
_STEP_MS = ("fixed_ms", "per_decode_seq_ms", "per_kv_token_ms", "prefill_min_ms", "prefill_fixed_ms")
_LOAD_MS = ("disk_fixed_ms", "disk_per_rank_ms", "cpu_to_gpu_ms")


def time_scaled(config: EngineConfig, k: float) -> EngineConfig:
    """``config`` with every step and every adapter load ``k`` times longer: the engine a pod at
    ``--speedup 1/k`` runs, in wall seconds."""
    if k <= 0:
        raise ValueError(f"the time scale must be positive, got {k}")
    step = config.step_time
    load = config.lora_load
    return dataclasses.replace(
        config,
        step_time=dataclasses.replace(
            step,
            **{name: getattr(step, name) * k for name in _STEP_MS},
            prefill_tokens_per_s=step.prefill_tokens_per_s / k,
        ),
        lora_load=dataclasses.replace(load, **{name: getattr(load, name) * k for name in _LOAD_MS}),
    )


# -- the live fleet -------------------------------------------------------------------------------
def live_scenario(scenario: Scenario, pods: int | None = None) -> Scenario:
    """The scenario the live bench runs: ``pods`` pods if given. One simulator process serves every
    pod with one engine config, so per-pod engine values cannot be run live."""
    if scenario.fleet.per_pod:
        raise ScenarioError("fleet.perPod", [("fleet.perPod", "the live bench runs one engine config")])
    if pods is None or pods == scenario.fleet.pods:
        return scenario
    if pods < 1:
        raise ValueError(f"pods must be at least 1, got {pods}")
    return scenario.model_copy(update={"fleet": scenario.fleet.model_copy(update={"pods": pods})})


def sim_args(
    config: EngineConfig, *, profile: str, model: str, adapters: Sequence[str], speedup: float
) -> list[str]:
    """``pointsman-sim`` flags (all but ``--host`` / ``--ports``) whose pods run ``config`` (the
    profile's engine with the scenario's values) at ``speedup``."""
    args = ["--profile", profile, "--model", model, "--speedup", repr(speedup)]
    if adapters:
        args += ["--adapters", ",".join(adapters)]
    args += ["--max-loras", str(config.max_loras), "--max-num-seqs", str(config.max_num_seqs)]
    args += ["--max-num-batched-tokens", str(config.max_num_batched_tokens)]
    args += ["--num-gpu-blocks-override", str(config.num_gpu_blocks)]
    args += ["--max-model-len", str(config.max_model_len)]
    if config.max_cpu_loras is not None:
        args += ["--max-cpu-loras", str(config.max_cpu_loras)]
    return args


# -- the load: prompts, the trace, inference-perf -------------------------------------------------
# The simulator counts a prompt's tokens as its characters / 4. The bench's tokenizer
# (bench/live_tokenizer.py) has words of a space and three digits, so an n-token prompt made from its
# vocabulary is 4n characters: n tokens for the pods too.
PROMPT_WORD_CHARS = 4


def prompt_text(tokens: int, offset: int = 0) -> str:
    """A prompt of ``tokens`` words of the bench tokenizer's vocabulary (``" 000"`` .. ``" 999"``)."""
    return "".join(f" {(offset + i) % 1000:03d}" for i in range(tokens))


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


# -- one request's outcome, and a run's statistics ------------------------------------------------
@dataclass(frozen=True, slots=True)
class RequestResult:
    """One live request as the client saw it; times in seconds (the client's clock)."""

    ok: bool
    start: float
    end: float
    ttft: float | None = None
    tpot: float | None = None
    output_tokens: int = 0
    model: str | None = None
    error: str | None = None
    prompt_tokens: int | None = None  # as sent (inference-perf's requests: to match them to the trace)
    max_tokens: int | None = None

    @property
    def e2e(self) -> float:
        return self.end - self.start


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


@dataclass(frozen=True, slots=True)
class LiveStats:
    """A live run's figures, named as :class:`~pointsman_quality.runs.RunStats`'s."""

    rate: float
    requests: int
    finished: int
    failed: int
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_p90_s: float
    e2e_p90_s: float
    tokens_per_s: float

    def as_dict(self) -> dict[str, float | int]:
        return dataclasses.asdict(self)


def live_stats(
    rate: float, trace: Sequence[TraceRequest], results: Sequence[RequestResult], since: float = 0.0
) -> LiveStats:
    """A live run's figures over the requests that arrived ``since`` seconds into the trace or later
    (the earlier ones warm the fleet up), taken as the virtual runs take them (nearest rank). The
    trace's time 0 is the first send less the first arrival; output tokens per second from ``since``
    to the last end."""
    if not results:
        return LiveStats(rate, sum(r.arrival >= since for r in trace), 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    zero = min(r.start for r in results) - (trace[0].arrival if trace else 0.0)
    requests = sum(r.arrival >= since - 1e-9 for r in trace)
    if len(results) == len(trace):
        # The k-th send is the k-th arrival (sends keep the trace's order, give or take a few ms), so
        # a request sent a hair early across ``since`` still counts once.
        arrivals = sorted(r.arrival for r in trace)
        by_send = sorted(results, key=lambda r: r.start)
        counted = [r for r, at in zip(by_send, arrivals, strict=True) if at >= since - 1e-9]
    else:
        counted = [r for r in results if r.start - zero >= since - 1e-9]
    served = [r for r in counted if r.ok]
    ttft = sorted(r.ttft for r in served if r.ttft is not None)
    tpot = sorted(r.tpot for r in served if r.tpot is not None and r.output_tokens > 1)
    e2e = sorted(r.e2e for r in served)
    tokens = sum(r.output_tokens for r in served)
    span = max((r.end for r in counted), default=zero + since) - (zero + since)
    return LiveStats(
        rate=rate,
        requests=requests,
        finished=len(served),
        failed=requests - len(served),
        ttft_p50_s=percentile(ttft, 0.5),
        ttft_p90_s=percentile(ttft, 0.9),
        ttft_p99_s=percentile(ttft, 0.99),
        tpot_p90_s=percentile(tpot, 0.9),
        e2e_p90_s=percentile(e2e, 0.9),
        tokens_per_s=tokens / span if span > 0 else 0.0,
    )


# -- the virtual runs ----------------------------------------------------------------------------
def virtual_run(
    scenario: Scenario,
    contender: Contender,
    engines: Sequence[EngineConfig],
    trace: Sequence[TraceRequest],
    rate: float,
    seed: int = 0,
    snapshot_interval: float = DEFAULT_SNAPSHOT_INTERVAL,
    since: float = 0.0,
) -> RunStats:
    """One virtual run over a given trace (the one the live client sent), its figures over the
    requests that arrived ``since`` seconds in or later, as :func:`live_stats` counts them."""
    router = contender.router(scenario, seed)
    result = run_fleet(
        engines,
        trace,
        router,
        snapshot_interval=snapshot_interval,
        on_finish=lambda i, _served: router.finished(trace[i]),
    )
    return window_stats(rate, trace, result, len(engines), since)


def window_stats(
    rate: float, trace: Sequence[TraceRequest], result: FleetResult, pods: int, since: float = 0.0
) -> RunStats:
    """:class:`~pointsman_quality.runs.RunStats` of the requests that arrived at ``since`` or later
    (adapter loads: the whole run's)."""
    counted = {f"r{i}" for i, r in enumerate(trace) if r.arrival >= since - 1e-9}
    served = [s for s in result.served if s.request.request_id in counted]
    requests = [s.request for s in served]
    ttft = sorted(r.time_to_first_token for r in requests)
    tpot = sorted(r.time_per_output_token for r in requests if r.output_tokens > 1)
    e2e = sorted(r.e2e_latency for r in requests)
    per_pod = [0] * pods
    for s in served:
        per_pod[s.pod] += 1
    tokens = sum(r.output_tokens for r in requests)
    span = max((r.finished_at for r in requests), default=since) - since
    return RunStats(
        rate=rate,
        requests=len(counted),
        finished=len(served),
        rejected=len(counted) - len(served),
        ttft_p50_s=percentile(ttft, 0.5),
        ttft_p90_s=percentile(ttft, 0.9),
        ttft_p99_s=percentile(ttft, 0.99),
        tpot_p90_s=percentile(tpot, 0.9),
        e2e_p90_s=percentile(e2e, 0.9),
        tokens_per_s=tokens / span if span > 0 else 0.0,
        adapter_loads_disk=sum(t.lora_loads_from_disk for t in result.totals),
        adapter_loads_cpu=sum(t.lora_loads_from_cpu for t in result.totals),
        max_pod_share=max(per_pod) / len(served) if served else 0.0,
    )


def median_stats(runs: Sequence[RunStats]) -> dict[str, float]:
    """Each figure's median over runs that differ only in the router's seed (the seed moves short
    runs' percentiles by 10-20%: one run is not the expectation)."""
    if not runs:
        raise ValueError("no runs")
    fields = runs[0].as_dict()
    return {name: float(statistics.median(float(r.as_dict()[name]) for r in runs)) for name in fields}


def send_lag(trace: Sequence[TraceRequest], results: Sequence[RequestResult]) -> dict[str, float]:
    """How late the client sent, in ms (p50, p99, max): the k-th send after the first against the
    k-th arrival after the first. A late client delays arrivals the virtual run makes on time."""
    arrivals = sorted(r.arrival for r in trace)
    starts = sorted(r.start for r in results)
    if not arrivals or len(starts) != len(arrivals):
        return {}
    lags = sorted((s - starts[0]) - (a - arrivals[0]) for s, a in zip(starts, arrivals, strict=True))
    return {
        "p50": round(percentile(lags, 0.5) * 1000, 2),
        "p99": round(percentile(lags, 0.99) * 1000, 2),
        "max": round(lags[-1] * 1000, 2),
    }


# -- live vs virtual ------------------------------------------------------------------------------
AGREEMENT_METRICS = ("ttft_p50_s", "ttft_p90_s")
"""Must agree within the tolerance; the others are shown for what they tell."""
COMPARED_METRICS = (*AGREEMENT_METRICS, "ttft_p99_s", "tpot_p90_s", "e2e_p90_s", "tokens_per_s")
TOLERANCE = 0.2


def agreement(
    live: LiveStats | Mapping[str, float],
    virtual: RunStats | Mapping[str, float],
    tolerance: float = TOLERANCE,
) -> dict[str, Any]:
    """``live / virtual`` for each compared metric, and whether the required ones (p50 and p90 TTFT)
    are within ``tolerance`` of 1 (a ratio of ``None``: the virtual value is 0)."""
    live_values = live.as_dict() if isinstance(live, LiveStats) else dict(live)
    virtual_values = virtual.as_dict() if isinstance(virtual, RunStats) else dict(virtual)
    ratios: dict[str, float | None] = {}
    for name in COMPARED_METRICS:
        base = float(virtual_values[name])
        ratios[name] = float(live_values[name]) / base if base > 0 else None
    agrees = all(
        (ratio := ratios[name]) is not None and abs(ratio - 1.0) <= tolerance for name in AGREEMENT_METRICS
    )
    return {"ratios": ratios, "agrees": agrees, "tolerance": tolerance}


# -- the builtin client's stream ------------------------------------------------------------------
class SseStream:
    """An OpenAI completions SSE body read incrementally: :meth:`feed` takes bytes as they arrive and
    says how many events with generated text they completed."""

    def __init__(self) -> None:
        self._buffer = b""
        self.text_events = 0
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.error: str | None = None

    def feed(self, data: bytes) -> int:
        self._buffer += data
        found = 0
        while not self.done:
            end, sep = self._event_end()
            if end < 0:
                break
            event, self._buffer = self._buffer[:end], self._buffer[end + sep :]
            found += self._event(event)
        return found

    def _event_end(self) -> tuple[int, int]:
        ends = [(i, len(s)) for s in (b"\n\n", b"\r\n\r\n") if (i := self._buffer.find(s)) >= 0]
        return min(ends) if ends else (-1, 0)

    def _event(self, event: bytes) -> int:
        data = b"\n".join(
            line[5:].strip()
            for line in event.replace(b"\r\n", b"\n").split(b"\n")
            if line.startswith(b"data:")
        )
        if not data:
            return 0
        if data == b"[DONE]":
            self.done = True
            return 0
        try:
            payload = json.loads(data)
        except json.JSONDecodeError:
            return 0
        if not isinstance(payload, dict):
            return 0
        if isinstance(payload.get("error"), dict):
            self.error = str(payload["error"].get("message"))
            return 0
        if isinstance(payload.get("usage"), dict):
            self.usage = payload["usage"]
        choices = payload.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            text = choices[0].get("text")
            if text is None and isinstance(choices[0].get("delta"), dict):
                text = choices[0]["delta"].get("content")
            if text:
                self.text_events += 1
                return 1
        return 0

    @property
    def output_tokens(self) -> int:
        """The server's count when it sent ``usage``, else one per text event (the simulator's
        streams carry one token per event)."""
        if self.usage is not None and isinstance(self.usage.get("completion_tokens"), int):
            return int(self.usage["completion_tokens"])
        return self.text_events


# -- the report -----------------------------------------------------------------------------------
def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.0f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _yes(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _runs(result: Mapping[str, Any]) -> Iterable[tuple[float, str, Mapping[str, Any]]]:
    for level in result["levels"]:
        for name, run in level["contenders"].items():
            yield level["level"], name, run


def markdown(result: Mapping[str, Any]) -> str:
    """``bench/results/live-SCENARIO.md`` from the json ``bench/live.py`` writes."""
    setup = result["setup"]
    k = setup["time_scale"]
    lines = [
        f"# Live vs virtual: scenario `{result['scenario']}`"
        + (f" ({result['variant']})" if result["variant"] else ""),
        "",
        f"- Client: **{result['client']}**: {result['client_note']}.",
        f"- Time scale k = {k:g}: the pods run `--speedup {1 / k:g}` (every step and adapter load "
        f"{k:g} times longer) at 1/{k:g} of the arrival rate; the virtual runs use the same "
        f"{k:g}-times-slower engine. {setup['pods']} pods; per run {setup.get('warmup_s', 0):g} s of "
        f"warm-up arrivals (sent, not counted: the cold start, every adapter loaded from disk), then "
        f"{setup['duration_s']:g} s of counted ones.",
        f"- Levels are fractions of `{setup['reference']}`'s capacity, {setup['capacity_rps']:.1f} req/s "
        f"on the unscaled engine ({setup['capacity_source']}): {setup['capacity_rps'] / k:.2f} req/s at "
        f"1/{k:g} of the rate.",
        f"- Virtual: each live run replayed in virtual time with the requests the client sent, median of "
        f"{setup['virtual_seeds']} router seeds.",
        f"- Machine: {result['machine']['note']}",
        "",
        "## Agreement (live / virtual)",
        "",
        f"Required: {setup['required']}.",
        "",
        "| level | contender | own load | virtual as | TTFT p50 ms live / virtual | ratio "
        "| TTFT p90 ms live / virtual | ratio | in seed range p50 / p90 | p99 ratio | TPOT p90 ratio "
        "| e2e p90 ratio | agrees |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level, name, run in _runs(result):
        live, virtual, agree = run.get("live"), run.get("virtual"), run.get("agreement")
        if not live or not virtual or not agree:
            continue
        ratios = agree["ratios"]
        verdict = ("yes" if agree["agrees"] else "**no**") if run["required"] else "(not required)"
        own = run.get("own_load")
        inside = run.get("in_seed_range", {})
        lines.append(
            f"| {level:g} | {name} | {'-' if own is None else f'{own:g}'} | {run['virtual_contender']} "
            f"| {_ms(live['ttft_p50_s'])} / {_ms(virtual['ttft_p50_s'])} | {_ratio(ratios['ttft_p50_s'])} "
            f"| {_ms(live['ttft_p90_s'])} / {_ms(virtual['ttft_p90_s'])} | {_ratio(ratios['ttft_p90_s'])} "
            f"| {_yes(inside.get('ttft_p50_s'))} / {_yes(inside.get('ttft_p90_s'))} "
            f"| {_ratio(ratios['ttft_p99_s'])} | {_ratio(ratios['tpot_p90_s'])} "
            f"| {_ratio(ratios['e2e_p90_s'])} | {verdict} |"
        )
    stale = [(level, name, run) for level, name, run in _runs(result) if run.get("virtual_stale")]
    if stale:
        interval = stale[0][2]["virtual_stale"]["snapshot_interval_s"]
        lines += [
            "",
            f"Sensitivity to the age of the routing data: the same virtual replay with snapshots every "
            f"{interval * 1000:g} ms instead of 50 (the live collector scrapes each pod on its own jittered "
            "50 ms timer and publishes at most twice an interval, so live data is older on average).",
            "",
            f"| level | contender | TTFT p50 ms virtual @{interval * 1000:g} ms | ratio | p90 | ratio |",
            "|---|---|---|---|---|---|",
        ]
        for level, name, run in stale:
            v = run["virtual_stale"]
            lines.append(
                f"| {level:g} | {name} | {_ms(v['ttft_p50_s'])} | {_ratio(v['ratios']['ttft_p50_s'])} "
                f"| {_ms(v['ttft_p90_s'])} | {_ratio(v['ratios']['ttft_p90_s'])} |"
            )
    lines += [
        "",
        "## Live runs",
        "",
        "| level | contender | client | req/s | requests | finished | failed | TTFT p50 ms | p90 | p99 "
        "| TPOT p90 ms | e2e p90 s | output tok/s | cores (ours / machine) | disturbed |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level, name, run in _runs(result):
        live = run.get("live")
        if not live:
            lines.append(f"| {level:g} | {name} | failed: {run.get('error', '?')} |" + " |" * 12)
            continue
        cpu = run.get("cpu", {})
        lines.append(
            f"| {level:g} | {name} | {run.get('client', '-')} | {live['rate']:.2f} | {live['requests']} "
            f"| {live['finished']} | {live['failed']} | {_ms(live['ttft_p50_s'])} "
            f"| {_ms(live['ttft_p90_s'])} | {_ms(live['ttft_p99_s'])} | {_ms(live['tpot_p90_s'])} "
            f"| {live['e2e_p90_s']:.1f} "
            f"| {live['tokens_per_s']:.0f} | {cpu.get('ours_cores', '-')} / {cpu.get('machine_cores', '-')} "
            f"| {'yes' if cpu.get('disturbed') else 'no'} |"
        )
    lines += [
        "",
        "## Virtual runs (the same requests, the same k)",
        "",
        "| level | contender | as | TTFT p50 ms (seed range) | p90 (seed range) | p99 | TPOT p90 ms "
        "| e2e p90 s | output tok/s | adapter loads | max pod share |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level, name, run in _runs(result):
        virtual, spread = run.get("virtual"), run.get("virtual_range", {})
        if not virtual:
            continue
        p50, p90 = spread.get("ttft_p50_s", [None, None]), spread.get("ttft_p90_s", [None, None])
        lines.append(
            f"| {level:g} | {name} | {run['virtual_contender']} "
            f"| {_ms(virtual['ttft_p50_s'])} ({_ms(p50[0])}-{_ms(p50[1])}) "
            f"| {_ms(virtual['ttft_p90_s'])} ({_ms(p90[0])}-{_ms(p90[1])}) | {_ms(virtual['ttft_p99_s'])} "
            f"| {_ms(virtual['tpot_p90_s'])} | {virtual['e2e_p90_s']:.1f} | {virtual['tokens_per_s']:.0f} "
            f"| {virtual['adapter_loads_disk']:.0f} | {virtual['max_pod_share']:.2f} |"
        )
    warm = [(level, name, run) for level, name, run in _runs(result) if run.get("with_warmup")]
    if warm:
        lines += [
            "",
            "The same comparison counting the warm-up's requests too (the cold start dominates their "
            "p90: a handful of early routing choices decide which requests wait for an adapter load):",
            "",
            "| level | contender | TTFT p50 ms live / virtual | ratio | TTFT p90 ms live / virtual | ratio "
            "| virtual p90 seed range ms |",
            "|---|---|---|---|---|---|---|",
        ]
        for level, name, run in warm:
            w = run["with_warmup"]
            lo, hi = w["virtual_range"]["ttft_p90_s"]
            lines.append(
                f"| {level:g} | {name} | {_ms(w['live']['ttft_p50_s'])} / {_ms(w['virtual']['ttft_p50_s'])} "
                f"| {_ratio(w['agreement']['ratios']['ttft_p50_s'])} "
                f"| {_ms(w['live']['ttft_p90_s'])} / {_ms(w['virtual']['ttft_p90_s'])} "
                f"| {_ratio(w['agreement']['ratios']['ttft_p90_s'])} | {_ms(lo)}-{_ms(hi)} |"
            )
    notes = result.get("notes") or []
    if notes:
        lines += ["", "## Notes", "", *[f"- {note}" for note in notes]]
    return "\n".join(lines) + "\n"
