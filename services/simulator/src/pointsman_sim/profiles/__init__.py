"""Engine profiles: a GPU + model + vLLM version as the engine's constants, shipped as YAML files.

Each YAML file beside this module cites the published figure behind every constant; ``load_profile(name)``
turns one into an :class:`~pointsman_sim.engine.EngineConfig`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar

import yaml

from pointsman_sim.engine import EngineConfig, LoraLoadModel, StepTimeModel

DEFAULT_PROFILE = "llama-3.1-8b-h100"

_T = TypeVar("_T")


class ProfileError(ValueError):
    """A profile is unknown or its file is malformed."""


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    model: str
    vllm_version: str
    engine: EngineConfig


def profile_names() -> list[str]:
    files = resources.files(__name__).iterdir()
    return sorted(f.name.removesuffix(".yaml") for f in files if f.name.endswith(".yaml"))


def load_profile(name: str) -> Profile:
    """Raise :class:`ProfileError` for an unknown name or a malformed file."""
    if name not in profile_names():
        raise ProfileError(f"unknown profile {name!r}; known: {', '.join(profile_names())}")
    text = resources.files(__name__).joinpath(f"{name}.yaml").read_text()
    return parse_profile(name, yaml.safe_load(text))


# The EngineConfig fields a profile (or a benchmark scenario) may set as plain numbers.
ENGINE_KEYS = (
    "num_gpu_blocks",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "max_loras",
    "max_cpu_loras",
)


def parse_profile(name: str, data: Any) -> Profile:
    if not isinstance(data, dict):
        raise ProfileError(f"profile {name}: expected a mapping, got {type(data).__name__}")
    known = {
        *ENGINE_KEYS,
        "model",
        "vllm_version",
        "scheduler",
        "enable_prefix_caching",
        "step_time",
        "lora_load",
    }
    unknown = sorted(set(data) - known)
    if unknown:
        raise ProfileError(f"profile {name}: unknown keys {unknown}")
    scheduler = data.get("scheduler")
    if scheduler not in ("v0", "v1"):
        raise ProfileError(f"profile {name}: scheduler must be v0 or v1, got {scheduler!r}")
    # vLLM V1 caches prefixes unless told not to; V0 did only when asked.
    caching = data.get("enable_prefix_caching", scheduler == "v1")
    if not isinstance(caching, bool):
        raise ProfileError(f"profile {name}: enable_prefix_caching must be true or false, got {caching!r}")
    try:
        engine = EngineConfig(
            **{key: data[key] for key in ENGINE_KEYS if key in data},
            chunked_prefill=scheduler == "v1",
            enable_prefix_caching=caching,
            step_time=_section(name, "step_time", StepTimeModel, data.get("step_time", {})),
            lora_load=_section(name, "lora_load", LoraLoadModel, data.get("lora_load", {})),
        )
    except (TypeError, ValueError) as exc:
        raise ProfileError(f"profile {name}: {exc}") from exc
    return Profile(name, str(data.get("model", "")), str(data.get("vllm_version", "")), engine)


def _section(name: str, key: str, kind: type[_T], values: Any) -> _T:
    if not isinstance(values, dict):
        raise ProfileError(f"profile {name}: {key} must be a mapping")
    fields = {f.name for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ProfileError(f"profile {name}: unknown keys {unknown} in {key}")
    return kind(**values)
