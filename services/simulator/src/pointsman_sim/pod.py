"""One simulated vLLM pod: its engine and driver, its served models, its metrics page and pins."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from pointsman_sim.control import Faults, Pins
from pointsman_sim.driver import EngineDriver, RequestStream
from pointsman_sim.engine import BLOCK_SIZE, Engine, EngineConfig, StepResult
from pointsman_sim.metrics import Load, PodMetrics
from pointsman_sim.prefix import block_hashes

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


class ModelNotServed(LookupError):
    """The request names neither the base model nor one of the pod's adapters."""


@dataclass(frozen=True, slots=True)
class PodSpec:
    name: str
    """Sent in every response's ``x-pointsman-pod`` header; ``host:port`` unless set."""
    model: str = DEFAULT_MODEL
    adapters: tuple[str, ...] = ()
    engine: EngineConfig = field(default_factory=EngineConfig)
    speedup: float = 1.0
    metrics_version: str = "current"
    lora_info_labels: str = "v0"

    def __post_init__(self) -> None:
        if len(set(self.adapters)) != len(self.adapters):
            raise ValueError(f"adapter names repeat: {list(self.adapters)}")
        for adapter in self.adapters:
            # Commas would split the name in vllm:lora_requests_info's comma-separated labels.
            if not adapter or "," in adapter or adapter == self.model:
                raise ValueError(f"bad adapter name {adapter!r}: empty, has a comma or is the base model")
        if self.adapters and self.engine.max_loras == 0:
            raise ValueError("adapters need max_loras of at least 1")


class SimPod:
    """Use as ``async with pod:`` to run its engine; requests are served only inside."""

    def __init__(self, spec: PodSpec, *, wall_clock: Callable[[], float] = time.time) -> None:
        self.spec = spec
        self.engine = Engine(spec.engine)
        self.driver = EngineDriver(self.engine, speedup=spec.speedup, on_step=self._on_step)
        self.metrics = PodMetrics(
            spec.model,
            spec.engine.num_gpu_blocks,
            version=spec.metrics_version,
            lora_semantics=spec.lora_info_labels,
            prefix_caching=spec.engine.enable_prefix_caching,
        )
        self.pins: Pins | None = None
        self.faults: Faults | None = None
        self.started_at = int(wall_clock())
        self._wall_clock = wall_clock
        self._adapters = list(spec.adapters)  # in serving order; changed by load/unload_adapter

    @property
    def adapters(self) -> tuple[str, ...]:
        return tuple(self._adapters)

    def set_faults(self, faults: Faults | None) -> None:
        self.faults = faults
        self.driver.set_paused(faults is not None and faults.paused)

    def load_adapter(self, name: str) -> None:
        """Serve one more adapter (vLLM loads its weights at first use); raise ``ValueError``."""
        if name in self._adapters or name == self.spec.model:
            raise ValueError(f"The lora adapter '{name}' has already been loaded.")
        if not name or "," in name:
            raise ValueError(f"bad adapter name {name!r}: empty or has a comma")
        if self.spec.engine.max_loras == 0:
            raise ValueError("LoRA is disabled on this pod (max_loras 0)")
        self._adapters.append(name)

    def unload_adapter(self, name: str) -> None:
        """Stop serving an adapter (requests in flight finish); raise :class:`ModelNotServed`."""
        if name not in self._adapters:
            raise ModelNotServed(name)
        self._adapters.remove(name)
        self.engine.unload_adapter(name)

    @property
    def name(self) -> str:
        return self.spec.name

    def adapter_for(self, model: str) -> str | None:
        """The adapter a request's ``model`` names (``None``: the base model)."""
        if model == self.spec.model:
            return None
        if model in self._adapters:
            return model
        raise ModelNotServed(model)

    def submit(
        self, request_id: str, model: str, prompt: int | tuple[int, ...], max_tokens: int
    ) -> RequestStream:
        """Raise :class:`ModelNotServed`, or the engine's ``RequestRejected``.

        ``prompt``: its token ids, whose full blocks the prefix cache may share; or a count of tokens
        that share nothing with any other request's."""
        adapter = self.adapter_for(model)
        if isinstance(prompt, int):
            return self.driver.submit(request_id, prompt, max_tokens, adapter)
        hashes = block_hashes(prompt, adapter, BLOCK_SIZE)
        return self.driver.submit(request_id, len(prompt), max_tokens, adapter, hashes)

    def cancel(self, request_id: str) -> None:
        self.driver.cancel(request_id)

    def abort_all(self) -> int:
        """End every in-flight request (their clients get a 503 or an SSE error event)."""
        return self.driver.abort_all()

    def page_load(self) -> Load:
        """The load the page reports: the engine's, with the pins over it."""
        engine = self.engine
        load = Load(
            waiting=engine.waiting_count,
            running=engine.running_count,
            kv_cache_usage=engine.kv_usage,
            running_adapters=engine.running_adapters,
            waiting_adapters=engine.waiting_adapters,
            max_lora=engine.max_loras,
        )
        return load if self.pins is None else self.pins.apply(load)

    def metrics_page(self) -> str:
        load = self.page_load()
        if self._shows_lora():
            self._stamp_lora(load)
        return self.metrics.render(load, self.engine.totals())

    def _shows_lora(self) -> bool:
        # vLLM has the LoRA family only with LoRA enabled; pinned adapters make it appear too.
        return bool(self._adapters) or (self.pins is not None and self.pins.pins_lora)

    def _stamp_lora(self, load: Load) -> None:
        self.metrics.lora_info.observe(
            load.max_lora, load.running_adapters, load.waiting_adapters, self._wall_clock()
        )

    def _on_step(self, result: StepResult) -> None:
        self.metrics.observe_step(result)
        # vLLM stamps the current adapter combination every step, so short-lived ones show up too.
        if self._shows_lora():
            self._stamp_lora(self.page_load())

    async def __aenter__(self) -> SimPod:
        await self.driver.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.driver.__aexit__(exc_type, exc, tb)
