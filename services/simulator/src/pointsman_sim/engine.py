"""One vLLM engine as a pure state machine: continuous batching, a paged KV cache, LoRA slots.

No I/O, no asyncio, no clock: the driver passes the simulated time in, as seconds. ``step(now)`` runs
one engine step that starts at ``now`` and says how long it lasts; the state read afterwards is the
state at the end of that step (the tokens it produced are the driver's to deliver at
``result.ends_at``).

The scheduler follows vLLM V1's: running requests first (each decoding request gets room for one more
token; when the KV cache is full the most recently admitted request is preempted back to the head of
the waiting queue and later recomputed), then, if nothing was preempted, waiting requests in FCFS
order while the batch has room. A waiting request whose adapter would need one slot more than
``max_loras`` is skipped and keeps its place; one whose prompt does not fit the free KV blocks stops
admission for everyone behind it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

BLOCK_SIZE = 16
"""Tokens per KV-cache block (vLLM's default block size)."""


class EngineError(Exception):
    """Base of the engine's errors."""


class RequestRejected(EngineError):
    """The request can never run on this engine (vLLM answers these with HTTP 400)."""


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    """``T_step = a + b*B + c*K + N_prefill / P`` ms, times ``1 + alpha + beta*(adapters - 1)`` with LoRA.

    B = decoding sequences, K = tokens resident in the KV cache, N_prefill = prompt tokens computed in
    the step, adapters = distinct adapters in the batch. The defaults are the ``llama-3.1-8b-h100``
    column of docs/vllm-figures.md (vLLM V1).
    """

    fixed_ms: float = 7.0
    per_decode_seq_ms: float = 0.040
    per_kv_token_ms: float = 4.7e-5
    prefill_tokens_per_s: float = 29_000.0
    lora_overhead: float = 0.05
    lora_per_extra_adapter: float = 0.0008

    def step_seconds(self, *, decoding: int, kv_tokens: int, prefill_tokens: int, adapters: int) -> float:
        ms = (
            self.fixed_ms
            + self.per_decode_seq_ms * decoding
            + self.per_kv_token_ms * kv_tokens
            + 1000.0 * prefill_tokens / self.prefill_tokens_per_s
        )
        if adapters:
            ms *= 1.0 + self.lora_overhead + self.lora_per_extra_adapter * (adapters - 1)
        return ms / 1000.0


@dataclass(frozen=True, slots=True)
class EngineConfig:
    # KV capacity: 26,500 blocks of 16 = 424k tokens (8B on H100, docs/vllm-figures.md).
    num_gpu_blocks: int = 26_500
    max_num_seqs: int = 256
    max_loras: int = 4
    max_model_len: int = 131_072
    step_time: StepTimeModel = field(default_factory=StepTimeModel)

    def __post_init__(self) -> None:
        for name in ("num_gpu_blocks", "max_num_seqs", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_loras < 0:
            raise ValueError(f"max_loras must not be negative, got {self.max_loras}")


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """A request that produced all its tokens; times are simulated seconds."""

    request_id: str
    prompt_tokens: int
    output_tokens: int
    arrived_at: float
    first_token_at: float
    finished_at: float

    @property
    def time_to_first_token(self) -> float:
        return self.first_token_at - self.arrived_at

    @property
    def e2e_latency(self) -> float:
        return self.finished_at - self.arrived_at


@dataclass(frozen=True, slots=True)
class StepResult:
    started_at: float
    duration: float
    tokens: Mapping[str, int]
    """Tokens produced in this step, by request id."""
    finished: tuple[FinishedRequest, ...]
    preempted: tuple[str, ...]

    @property
    def ends_at(self) -> float:
        return self.started_at + self.duration


@dataclass(frozen=True, slots=True)
class Totals:
    """The engine's counters since it started."""

    prompt_tokens: int
    generation_tokens: int
    finished: int
    aborted: int
    preemptions: int


@dataclass(slots=True)
class _Request:
    request_id: str
    prompt_tokens: int
    max_tokens: int
    adapter: str | None
    arrived_at: float
    output_tokens: int = 0
    # Tokens whose keys and values sit in the KV cache; the newest sampled token is computed next step.
    computed_tokens: int = 0
    blocks: int = 0
    first_token_at: float | None = None


def blocks_for(tokens: int) -> int:
    return math.ceil(tokens / BLOCK_SIZE)


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._waiting: list[_Request] = []
        self._running: dict[str, _Request] = {}  # in admission order: the last is preempted first
        self._ids: set[str] = set()  # every request in the engine, waiting or running
        self._running_adapters: Counter[str] = Counter()
        self._waiting_adapters: Counter[str] = Counter()
        self._free_blocks = config.num_gpu_blocks
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._finished = 0
        self._aborted = 0
        self._preemptions = 0

    # -- read-only state -------------------------------------------------------------------------

    @property
    def waiting_count(self) -> int:
        return len(self._waiting)

    @property
    def running_count(self) -> int:
        return len(self._running)

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV blocks in use, 0..1."""
        return 1.0 - self._free_blocks / self.config.num_gpu_blocks

    @property
    def running_adapters(self) -> frozenset[str]:
        return frozenset(self._running_adapters)

    @property
    def waiting_adapters(self) -> frozenset[str]:
        return frozenset(self._waiting_adapters)

    @property
    def max_loras(self) -> int:
        return self.config.max_loras

    @property
    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    def totals(self) -> Totals:
        return Totals(
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
            finished=self._finished,
            aborted=self._aborted,
            preemptions=self._preemptions,
        )

    # -- requests --------------------------------------------------------------------------------

    def submit(
        self, request_id: str, prompt_tokens: int, max_tokens: int, adapter: str | None, now: float
    ) -> None:
        """Queue a request; raise :class:`RequestRejected` if it could never run here."""
        if request_id in self._ids:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        if prompt_tokens < 1 or max_tokens < 1:
            raise RequestRejected("a request needs at least one prompt token and one output token")
        if prompt_tokens + max_tokens > self.config.max_model_len:
            raise RequestRejected(
                f"prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds the maximum "
                f"context length of {self.config.max_model_len} tokens"
            )
        # The last sampled token is never computed, hence the -1; a request that fits alone always
        # finishes, however often it is preempted.
        if blocks_for(prompt_tokens + max_tokens - 1) > self.config.num_gpu_blocks:
            raise RequestRejected(
                f"prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds the KV cache "
                f"of {self.config.num_gpu_blocks * BLOCK_SIZE} tokens"
            )
        if adapter is not None and self.config.max_loras == 0:
            raise RequestRejected(f"adapter {adapter!r} requested but LoRA is disabled (max_loras 0)")
        self._waiting.append(_Request(request_id, prompt_tokens, max_tokens, adapter, now))
        self._ids.add(request_id)
        if adapter is not None:
            self._waiting_adapters[adapter] += 1

    def cancel(self, request_id: str) -> bool:
        """Drop a waiting or running request (client gone); return whether the engine had it."""
        request = self._running.pop(request_id, None)
        if request is not None:
            self._free_blocks += request.blocks
            _discount(self._running_adapters, request.adapter)
        else:
            index = next((i for i, r in enumerate(self._waiting) if r.request_id == request_id), None)
            if index is None:
                return False
            request = self._waiting.pop(index)
            _discount(self._waiting_adapters, request.adapter)
        self._ids.discard(request_id)
        self._aborted += 1
        return True

    # -- stepping --------------------------------------------------------------------------------

    def step(self, now: float) -> StepResult:
        """Run one step starting at ``now``; a step with nothing to run has duration 0."""
        preempted = self._make_room_for_decodes()
        decoding = list(self._running.values())
        admitted = [] if preempted else self._admit(now)
        if not decoding and not admitted:
            return StepResult(now, 0.0, {}, (), tuple(preempted))

        for request in decoding:
            request.computed_tokens += 1
        duration = self.config.step_time.step_seconds(
            decoding=len(decoding),
            kv_tokens=sum(r.computed_tokens for r in self._running.values()),
            prefill_tokens=sum(r.computed_tokens for r in admitted),
            adapters=len(self._running_adapters),
        )
        ends_at = now + duration
        for request in admitted:
            if request.first_token_at is None:  # a recomputed prompt is not counted twice
                self._prompt_tokens += request.prompt_tokens
                request.first_token_at = ends_at
        tokens: dict[str, int] = {}
        for request in self._running.values():
            request.output_tokens += 1
            tokens[request.request_id] = 1
        self._generation_tokens += len(tokens)
        return StepResult(now, duration, tokens, self._finish(ends_at), tuple(preempted))

    def _make_room_for_decodes(self) -> list[str]:
        """Give each running request a slot for the token it computes this step, preempting if full."""
        preempted: list[str] = []
        for request in list(self._running.values()):
            if request.request_id not in self._running:
                continue  # preempted while making room for an earlier request
            need = blocks_for(request.computed_tokens + 1) - request.blocks
            while need > self._free_blocks:
                victim = self._running[next(reversed(self._running))]
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is request:
                    break
            else:
                self._free_blocks -= need
                request.blocks += need
        return preempted

    def _preempt(self, request: _Request) -> None:
        del self._running[request.request_id]
        _discount(self._running_adapters, request.adapter)
        self._free_blocks += request.blocks
        request.blocks = 0
        request.computed_tokens = 0
        # Victims go newest first, so inserting each at the head keeps the FCFS order among them.
        self._waiting.insert(0, request)
        if request.adapter is not None:
            self._waiting_adapters[request.adapter] += 1
        self._preemptions += 1

    def _admit(self, now: float) -> list[_Request]:
        admitted: list[_Request] = []
        skipped: list[_Request] = []
        stop = len(self._waiting)
        for i, request in enumerate(self._waiting):
            # A request that arrived after the step began waits for the next one.
            if len(self._running) >= self.config.max_num_seqs or request.arrived_at > now:
                stop = i
                break
            adapter = request.adapter
            if (
                adapter is not None
                and adapter not in self._running_adapters
                and len(self._running_adapters) >= self.config.max_loras
            ):
                skipped.append(request)
                continue
            # A resumed (preempted) request recomputes its output tokens too.
            prefill = request.prompt_tokens + request.output_tokens
            need = blocks_for(prefill)
            if need > self._free_blocks:
                stop = i
                break
            self._free_blocks -= need
            request.blocks = need
            request.computed_tokens = prefill
            self._running[request.request_id] = request
            if adapter is not None:
                self._running_adapters[adapter] += 1
                _discount(self._waiting_adapters, adapter)
            admitted.append(request)
        if admitted:
            self._waiting = skipped + self._waiting[stop:]
        return admitted

    def _finish(self, now: float) -> tuple[FinishedRequest, ...]:
        finished: list[FinishedRequest] = []
        for request in [r for r in self._running.values() if r.output_tokens >= r.max_tokens]:
            del self._running[request.request_id]
            self._ids.discard(request.request_id)
            self._free_blocks += request.blocks
            _discount(self._running_adapters, request.adapter)
            assert request.first_token_at is not None  # set when it was admitted
            finished.append(
                FinishedRequest(
                    request_id=request.request_id,
                    prompt_tokens=request.prompt_tokens,
                    output_tokens=request.output_tokens,
                    arrived_at=request.arrived_at,
                    first_token_at=request.first_token_at,
                    finished_at=now,
                )
            )
        self._finished += len(finished)
        return tuple(finished)


def _discount(counts: Counter[str], adapter: str | None) -> None:
    if adapter is None:
        return
    counts[adapter] -= 1
    if counts[adapter] <= 0:
        del counts[adapter]
