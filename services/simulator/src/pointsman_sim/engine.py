"""One vLLM engine as a pure state machine: continuous batching, a paged KV cache, LoRA slots.

No I/O, no asyncio, no clock: the driver passes the simulated time in, as seconds. ``step(now)`` runs
one engine step that starts at ``now`` and says how long it lasts; the state read afterwards is the
state at the end of that step (the tokens it produced are the driver's to deliver at
``result.ends_at``).

Every request carries ``prompt + output`` known tokens of which ``computed`` have keys and values in
the KV cache; a step computes some of the rest, and a request whose known tokens are all computed at
the end of the step samples one new token. A decoding request so computes one token per step (its
newest sample); a prompt is computed in one step or, with chunked prefill, over several.

Two schedulers, as vLLM has had:
- ``chunked_prefill`` (vLLM V1): one kind of step. Running requests first, each scheduled for its
  remaining tokens within the step's ``max_num_batched_tokens`` budget; when the KV cache has no block
  for one, the most recently admitted request is preempted back to the head of the waiting queue (its
  tokens recomputed later). Then, if nothing was preempted, waiting requests in FCFS order while the
  batch has fewer than ``max_num_seqs`` requests and budget is left, a prompt split across steps if
  needed.
- without (vLLM V0 default): a step is either prefill-only (whenever a waiting request can be admitted:
  whole prompts, FCFS, within the budget) or decode-only for every running request.

In both, a waiting request whose adapter would need one slot more than ``max_loras`` is skipped and
keeps its place; one whose prompt does not fit the free KV blocks stops admission for everyone behind
it. An adapter not in a GPU slot is loaded during the step that admits its request (from the CPU
cache of ``max_cpu_loras`` adapters, else from disk first), evicting the least recently used idle
adapter when the slots are full; the load time is added to that step.

Automatic prefix caching (vLLM V1's, on by default): a request may carry the hashes of its full
blocks (``pointsman_sim.prefix``); every full block a request computes is cached under its hash
(``pointsman_sim.prefix_cache``) and stays cached after the request ends, until a new block is needed
and no uncached free block is left (then the least recently freed cached block is reused). A request
admitted while its first blocks are cached takes them instead of computing them: its prefill starts
after its longest cached prefix (whole blocks, at most all tokens but the last, as vLLM). A request
without hashes never hits nor fills the cache: the engine then runs exactly as without caching.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from pointsman_sim.prefix_cache import PrefixCache

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
    the step, adapters = distinct adapters in the batch. A prefill-only step (V0 scheduler) takes
    ``max(prefill_min_ms, prefill_fixed_ms + N/P)`` instead. The defaults are the
    ``llama-3.1-8b-h100`` profile's (docs/simulator.md has the sources).
    """

    fixed_ms: float = 7.0
    per_decode_seq_ms: float = 0.040
    per_kv_token_ms: float = 4.7e-5
    prefill_tokens_per_s: float = 29_000.0
    prefill_min_ms: float = 0.0
    prefill_fixed_ms: float = 7.0
    lora_overhead: float = 0.05
    lora_per_extra_adapter: float = 0.0008

    def step_seconds(self, *, decoding: int, kv_tokens: int, prefill_tokens: int, adapters: int) -> float:
        ms = (
            self.fixed_ms
            + self.per_decode_seq_ms * decoding
            + self.per_kv_token_ms * kv_tokens
            + 1000.0 * prefill_tokens / self.prefill_tokens_per_s
        )
        return self._lora(ms, adapters) / 1000.0

    def prefill_step_seconds(self, *, prefill_tokens: int, adapters: int) -> float:
        ms = max(
            self.prefill_min_ms, self.prefill_fixed_ms + 1000.0 * prefill_tokens / self.prefill_tokens_per_s
        )
        return self._lora(ms, adapters) / 1000.0

    def _lora(self, ms: float, adapters: int) -> float:
        if adapters:
            return ms * (1.0 + self.lora_overhead + self.lora_per_extra_adapter * (adapters - 1))
        return ms


@dataclass(frozen=True, slots=True)
class LoraLoadModel:
    """How long bringing an adapter into a GPU slot takes, in ms."""

    disk_fixed_ms: float = 57.0
    disk_per_rank_ms: float = 2.9
    cpu_to_gpu_ms: float = 9.0
    rank: int = 16

    def seconds(self, *, from_disk: bool) -> float:
        ms = self.cpu_to_gpu_ms
        if from_disk:
            ms += self.disk_fixed_ms + self.disk_per_rank_ms * self.rank
        return ms / 1000.0


@dataclass(frozen=True, slots=True)
class EngineConfig:
    # KV capacity: 26,500 blocks of 16 = 424k tokens (8B on H100, docs/simulator.md).
    num_gpu_blocks: int = 26_500
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = True
    max_loras: int = 4
    max_cpu_loras: int | None = None
    """Adapters kept in CPU memory; ``None``: ``max_loras``, as vLLM defaults it."""
    max_model_len: int = 131_072
    enable_prefix_caching: bool = True
    step_time: StepTimeModel = field(default_factory=StepTimeModel)
    lora_load: LoraLoadModel = field(default_factory=LoraLoadModel)

    def __post_init__(self) -> None:
        for name in ("num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_loras < 0:
            raise ValueError(f"max_loras must not be negative, got {self.max_loras}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras ({self.max_loras})"
            )

    @property
    def cpu_lora_capacity(self) -> int:
        return self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """A request that produced all its tokens; times are simulated seconds."""

    request_id: str
    prompt_tokens: int
    output_tokens: int
    arrived_at: float
    first_token_at: float
    finished_at: float
    adapter: str | None = None
    scheduled_at: float | None = None
    """When a step first admitted it (its time in the queue ends)."""
    adapter_load: float = 0.0
    """Seconds its admission spent bringing its adapter into a GPU slot."""

    @property
    def time_in_queue(self) -> float:
        return (self.scheduled_at if self.scheduled_at is not None else self.arrived_at) - self.arrived_at

    @property
    def time_to_first_token(self) -> float:
        return self.first_token_at - self.arrived_at

    @property
    def e2e_latency(self) -> float:
        return self.finished_at - self.arrived_at

    @property
    def time_per_output_token(self) -> float:
        """Mean time between output tokens (0 for a one-token answer)."""
        if self.output_tokens < 2:
            return 0.0
        return (self.finished_at - self.first_token_at) / (self.output_tokens - 1)


@dataclass(frozen=True, slots=True)
class StepResult:
    started_at: float
    duration: float
    tokens: Mapping[str, int]
    """Tokens produced in this step, by request id."""
    finished: tuple[FinishedRequest, ...]
    preempted: tuple[str, ...]
    later_tokens: int = 0
    """How many of ``tokens`` followed an earlier token of the same request (inter-token latencies)."""

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
    lora_loads_from_disk: int = 0
    lora_loads_from_cpu: int = 0
    lora_evictions: int = 0
    """Idle adapters dropped from a GPU slot to make room for another."""
    lora_cpu_evictions: int = 0
    prefix_cache_queries: int = 0
    """Tokens looked up in the prefix cache: each admitted request's known tokens (vLLM's counter)."""
    prefix_cache_hits: int = 0
    """Of those, tokens found cached (whole blocks)."""


@dataclass(slots=True, eq=False)
class _Request:
    request_id: str
    prompt_tokens: int
    max_tokens: int
    adapter: str | None
    arrived_at: float
    output_tokens: int = 0
    computed_tokens: int = 0
    """Tokens whose keys and values sit in the KV cache; the newest sampled token is computed next."""
    blocks: int = 0
    scheduled: int = 0
    """Tokens being computed in the current step."""
    first_token_at: float | None = None
    scheduled_at: float | None = None  # the start of the step that first admitted it
    adapter_load: float = 0.0  # seconds spent loading its adapter when it was admitted
    block_hashes: tuple[int, ...] = ()
    """Hashes of the full blocks of the request's known tokens, as far as they are known."""
    cached: list[int] = field(default_factory=list)
    """Hashes of the cached blocks this request holds (taken on admission or filled by it)."""
    filled: int = 0
    """Blocks (from the first) already offered to the cache."""


def blocks_for(tokens: int) -> int:
    return -(-tokens // BLOCK_SIZE)


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._waiting: list[_Request] = []
        self._running: dict[str, _Request] = {}  # in admission order: the last is preempted first
        self._ids: set[str] = set()  # every request in the engine, waiting or running
        self._running_adapters: Counter[str] = Counter()
        self._waiting_adapters: Counter[str] = Counter()
        # Least recently used first; every adapter in a GPU slot is in the CPU cache too.
        self._gpu_loras: OrderedDict[str, None] = OrderedDict()
        self._cpu_loras: OrderedDict[str, None] = OrderedDict()
        self._free_blocks = config.num_gpu_blocks  # uncached free blocks and the cache's free ones
        self._cache = PrefixCache() if config.enable_prefix_caching else None
        self._prefix_queries = 0
        self._prefix_hits = 0
        self._kv_tokens = 0
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._finished = 0
        self._aborted = 0
        self._preemptions = 0
        self._loads_from_disk = 0
        self._loads_from_cpu = 0
        self._evictions = 0
        self._cpu_evictions = 0

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
    def prefix_cache_hit_rate(self) -> float | None:
        """Tokens hit over tokens queried since the start; None without caching or before a query."""
        if self._cache is None or not self._prefix_queries:
            return None
        return self._prefix_hits / self._prefix_queries

    @property
    def running_adapters(self) -> frozenset[str]:
        return frozenset(self._running_adapters)

    @property
    def waiting_adapters(self) -> frozenset[str]:
        return frozenset(self._waiting_adapters)

    @property
    def gpu_adapters(self) -> frozenset[str]:
        """Adapters in a GPU slot, running or idle."""
        return frozenset(self._gpu_loras)

    @property
    def cpu_adapters(self) -> frozenset[str]:
        return frozenset(self._cpu_loras)

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
            lora_loads_from_disk=self._loads_from_disk,
            lora_loads_from_cpu=self._loads_from_cpu,
            lora_evictions=self._evictions,
            lora_cpu_evictions=self._cpu_evictions,
            prefix_cache_queries=self._prefix_queries,
            prefix_cache_hits=self._prefix_hits,
        )

    def cached_prefix_blocks(self, block_hashes: tuple[int, ...]) -> int:
        """How many of the first blocks of ``block_hashes`` this engine holds cached, in use or free
        (what an admission now would hit, but for its last-token cap)."""
        if self._cache is None:
            return 0
        return self._cache.match(block_hashes, len(block_hashes))

    # -- requests --------------------------------------------------------------------------------

    def submit(
        self,
        request_id: str,
        prompt_tokens: int,
        max_tokens: int,
        adapter: str | None,
        now: float,
        block_hashes: tuple[int, ...] = (),
    ) -> None:
        """Queue a request; raise :class:`RequestRejected` if it could never run here.

        ``block_hashes``: of the request's full blocks of known tokens (prompt, then output), made for
        ``adapter``; none: its tokens share nothing with any other request's."""
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
        if (
            not self.config.chunked_prefill
            and prompt_tokens + max_tokens - 1 > self.config.max_num_batched_tokens
        ):
            raise RequestRejected(
                f"prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds "
                f"max_num_batched_tokens ({self.config.max_num_batched_tokens}) without chunked prefill"
            )
        if adapter is not None and self.config.max_loras == 0:
            raise RequestRejected(f"adapter {adapter!r} requested but LoRA is disabled (max_loras 0)")
        request = _Request(request_id, prompt_tokens, max_tokens, adapter, now)
        if self._cache is not None:
            request.block_hashes = block_hashes
        self._waiting.append(request)
        self._ids.add(request_id)
        if adapter is not None:
            self._waiting_adapters[adapter] += 1

    def cancel(self, request_id: str) -> bool:
        """Drop a waiting or running request (client gone); return whether the engine had it."""
        request = self._running.pop(request_id, None)
        if request is not None:
            self._release(request)
        else:
            index = next((i for i, r in enumerate(self._waiting) if r.request_id == request_id), None)
            if index is None:
                return False
            request = self._waiting.pop(index)
            _discount(self._waiting_adapters, request.adapter)
        self._ids.discard(request_id)
        self._aborted += 1
        return True

    def unload_adapter(self, adapter: str) -> bool:
        """Drop an idle adapter from the GPU slots and the CPU cache; ``False`` while it has requests."""
        if adapter in self._running_adapters or adapter in self._waiting_adapters:
            return False
        self._gpu_loras.pop(adapter, None)
        self._cpu_loras.pop(adapter, None)
        return True

    # -- stepping --------------------------------------------------------------------------------

    def step(self, now: float) -> StepResult:
        """Run one step starting at ``now``; a step with nothing to run has duration 0."""
        if self.config.chunked_prefill:
            return self._mixed_step(now)
        return self._separate_step(now)

    def _mixed_step(self, now: float) -> StepResult:
        budget = self.config.max_num_batched_tokens
        scheduled: list[_Request] = []
        preempted: list[str] = []
        decoding = 0
        for request in list(self._running.values()):
            # Victims are taken newest first, so the first one met ends the running requests.
            if budget <= 0 or (preempted and request.request_id not in self._running):
                break
            remaining = request.prompt_tokens + request.output_tokens - request.computed_tokens
            count = remaining if remaining < budget else budget
            # The common case inline (this loop runs once per token of the whole simulation).
            need = -(-(request.computed_tokens + count) // BLOCK_SIZE) - request.blocks
            if need <= self._free_blocks:
                self._free_blocks -= need
                if self._cache is not None and self._cache.free_count > self._free_blocks:
                    self._cache.evict(self._cache.free_count - self._free_blocks)
                request.blocks += need
                request.scheduled = count
                self._kv_tokens += count
            elif not self._allocate(request, count, preempted):
                break  # the request preempted itself: nothing newer is left running
            scheduled.append(request)
            budget -= count
            if count == 1 and request.output_tokens:
                decoding += 1
        load_seconds = 0.0
        admitted: list[_Request] = []
        if not preempted:
            admitted, load_seconds = self._admit(now, budget, chunk=True)
            scheduled += admitted
        if not scheduled:
            return StepResult(now, 0.0, {}, (), tuple(preempted))
        prefill = sum(r.scheduled for r in scheduled) - decoding
        duration = load_seconds + self.config.step_time.step_seconds(
            decoding=decoding,
            kv_tokens=self._kv_tokens,
            prefill_tokens=prefill,
            adapters=len(self._running_adapters),
        )
        return self._end_step(now, duration, scheduled, preempted)

    def _separate_step(self, now: float) -> StepResult:
        admitted, load_seconds = self._admit(now, self.config.max_num_batched_tokens, chunk=False)
        if admitted:
            duration = load_seconds + self.config.step_time.prefill_step_seconds(
                prefill_tokens=sum(r.scheduled for r in admitted), adapters=len(self._running_adapters)
            )
            return self._end_step(now, duration, admitted, [])
        scheduled: list[_Request] = []
        preempted: list[str] = []
        for request in list(self._running.values()):
            if request.request_id not in self._running:
                continue
            if not self._allocate(request, 1, preempted):
                break
            scheduled.append(request)
        if not scheduled:
            return StepResult(now, 0.0, {}, (), tuple(preempted))
        duration = self.config.step_time.step_seconds(
            decoding=len(scheduled),
            kv_tokens=self._kv_tokens,
            prefill_tokens=0,
            adapters=len(self._running_adapters),
        )
        return self._end_step(now, duration, scheduled, preempted)

    def _allocate(self, request: _Request, count: int, preempted: list[str]) -> bool:
        """Give a running request blocks for ``count`` more tokens, preempting the newest if full.

        Return ``False`` if ``request`` itself had to be preempted.
        """
        need = blocks_for(request.computed_tokens + count) - request.blocks
        while need > self._free_blocks:
            victim = self._running[next(reversed(self._running))]
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is request:
                return False
        self._take_free(need)
        request.blocks += need
        request.scheduled = count
        self._kv_tokens += count
        return True

    def _end_step(
        self, now: float, duration: float, scheduled: list[_Request], preempted: list[str]
    ) -> StepResult:
        ends_at = now + duration
        tokens: dict[str, int] = {}
        later = 0
        done: list[_Request] = []
        for request in scheduled:
            request.computed_tokens += request.scheduled
            request.scheduled = 0
            if request.block_hashes:
                self._fill(request)
            if request.computed_tokens < request.prompt_tokens + request.output_tokens:
                continue  # a prompt chunk: no token yet
            request.output_tokens += 1
            tokens[request.request_id] = 1
            if request.first_token_at is None:
                request.first_token_at = ends_at
                self._prompt_tokens += request.prompt_tokens  # a recomputed prompt is not counted twice
            elif request.output_tokens > 1:
                later += 1
            if request.output_tokens >= request.max_tokens:
                done.append(request)
        self._generation_tokens += len(tokens)
        return StepResult(now, duration, tokens, self._finish(done, ends_at), tuple(preempted), later)

    def _preempt(self, request: _Request) -> None:
        del self._running[request.request_id]
        self._release(request)
        request.computed_tokens = 0
        # Victims go newest first, so inserting each at the head keeps the FCFS order among them.
        self._waiting.insert(0, request)
        if request.adapter is not None:
            self._waiting_adapters[request.adapter] += 1
        self._preemptions += 1

    def _release(self, request: _Request) -> None:
        """Give back a request's blocks and adapter use (it already left ``_running``)."""
        if request.cached:
            assert self._cache is not None  # only a caching engine gives a request cached blocks
            # A cached block another request still holds stays in use.
            self._free_blocks += request.blocks - len(request.cached) + self._cache.release(request.cached)
            request.cached = []
            request.filled = 0
        else:
            self._free_blocks += request.blocks
        self._kv_tokens -= request.computed_tokens + request.scheduled
        request.blocks = 0
        request.scheduled = 0
        _discount(self._running_adapters, request.adapter)

    def _admit(self, now: float, budget: int, *, chunk: bool) -> tuple[list[_Request], float]:
        """Admit waiting requests FCFS; return them and the seconds spent loading their adapters."""
        admitted: list[_Request] = []
        skipped: list[_Request] = []
        load_seconds = 0.0
        stop = len(self._waiting)
        max_loras = self.config.max_loras
        # Once the slots are full they stay full for this step, so only the requests for the base
        # model or a running adapter can still be admitted: count them and stop when none is left,
        # rather than walk a long queue of skipped requests every step.
        eligible: int | None = None
        for i, request in enumerate(self._waiting):
            # A request that arrived after the step began waits for the next one.
            if len(self._running) >= self.config.max_num_seqs or budget <= 0 or request.arrived_at > now:
                stop = i
                break
            adapter = request.adapter
            if (
                adapter is not None
                and adapter not in self._running_adapters
                and len(self._running_adapters) >= max_loras
            ):
                skipped.append(request)
                if eligible is None:
                    eligible = self._eligible_waiting(len(admitted))
                if not eligible:
                    stop = i + 1
                    break
                continue
            # A resumed (preempted) request recomputes its output tokens too, but for its cached prefix.
            known = request.prompt_tokens + request.output_tokens
            hits = self._cached_prefix(request, known)
            hit_tokens = hits * BLOCK_SIZE
            remaining = known - hit_tokens
            if remaining > budget and not chunk:
                stop = i
                break
            count = min(remaining, budget)
            need = blocks_for(hit_tokens + count) - hits
            cache = self._cache
            # Cached blocks no request holds are among the free ones: taking them uses them up too.
            from_free = cache.free_among(request.block_hashes[:hits]) if cache is not None and hits else 0
            if need + from_free > self._free_blocks:
                stop = i
                break
            if cache is not None and hits:
                self._free_blocks -= cache.acquire(request.block_hashes[:hits])
                request.cached = list(request.block_hashes[:hits])
                request.filled = hits
            self._take_free(need)
            if self._cache is not None:
                self._prefix_queries += known
                self._prefix_hits += hit_tokens
            request.computed_tokens = hit_tokens
            request.blocks = hits + need
            request.scheduled = count
            self._kv_tokens += hit_tokens + count
            budget -= count
            self._running[request.request_id] = request
            if request.scheduled_at is None:
                request.scheduled_at = now
            if adapter is not None:
                loading = self._activate(adapter)
                load_seconds += loading
                request.adapter_load += loading
                self._running_adapters[adapter] += 1
                _discount(self._waiting_adapters, adapter)
            admitted.append(request)
            if eligible is not None:
                eligible -= 1
        if admitted:
            self._waiting = skipped + self._waiting[stop:]
        return admitted, load_seconds

    def _cached_prefix(self, request: _Request, known: int) -> int:
        """The blocks of ``request`` it would find cached now: all its known tokens but the last may
        hit, as vLLM recomputes at least one token to sample the next."""
        if not request.block_hashes or self._cache is None:
            return 0
        return self._cache.match(request.block_hashes, (known - 1) // BLOCK_SIZE)

    def _take_free(self, count: int) -> None:
        """Use ``count`` free blocks: uncached ones first, then the least recently freed cached ones."""
        self._free_blocks -= count
        cache = self._cache
        if cache is not None and cache.free_count > self._free_blocks:
            cache.evict(cache.free_count - self._free_blocks)

    def _fill(self, request: _Request) -> None:
        """Cache the blocks ``request`` has computed full since the last step."""
        cache = self._cache
        assert cache is not None  # only a caching engine keeps a request's hashes
        full = min(request.computed_tokens // BLOCK_SIZE, len(request.block_hashes))
        for index in range(request.filled, full):
            block_hash = request.block_hashes[index]
            if cache.add(block_hash):
                request.cached.append(block_hash)
        if full > request.filled:
            request.filled = full

    def _eligible_waiting(self, admitted: int) -> int:
        """Waiting requests not yet admitted this step that are for the base model or a running adapter."""
        for_adapters = sum(self._waiting_adapters.values())
        base = len(self._waiting) - admitted - for_adapters
        return base + sum(
            self._waiting_adapters[a] for a in self._running_adapters if a in self._waiting_adapters
        )

    def _activate(self, adapter: str) -> float:
        """Put an adapter in a GPU slot (it has one free or idle); return the seconds that takes."""
        if adapter in self._gpu_loras:
            self._gpu_loras.move_to_end(adapter)
            self._cpu_loras.move_to_end(adapter)
            return 0.0
        if len(self._gpu_loras) >= self.config.max_loras:
            idle = next(a for a in self._gpu_loras if a not in self._running_adapters)
            del self._gpu_loras[idle]
            self._evictions += 1
        from_disk = adapter not in self._cpu_loras
        if from_disk:
            if len(self._cpu_loras) >= self.config.cpu_lora_capacity:
                idle = next(a for a in self._cpu_loras if a not in self._gpu_loras)
                del self._cpu_loras[idle]
                self._cpu_evictions += 1
            self._cpu_loras[adapter] = None
            self._loads_from_disk += 1
        else:
            self._cpu_loras.move_to_end(adapter)
            self._loads_from_cpu += 1
        self._gpu_loras[adapter] = None
        return self.config.lora_load.seconds(from_disk=from_disk)

    def _finish(self, done: list[_Request], now: float) -> tuple[FinishedRequest, ...]:
        finished: list[FinishedRequest] = []
        for request in done:
            del self._running[request.request_id]
            self._ids.discard(request.request_id)
            self._release(request)
            assert request.first_token_at is not None  # set with its first token
            finished.append(
                FinishedRequest(
                    request_id=request.request_id,
                    prompt_tokens=request.prompt_tokens,
                    output_tokens=request.output_tokens,
                    arrived_at=request.arrived_at,
                    first_token_at=request.first_token_at,
                    finished_at=now,
                    adapter=request.adapter,
                    scheduled_at=request.scheduled_at,
                    adapter_load=request.adapter_load,
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
