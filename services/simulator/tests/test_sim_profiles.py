from __future__ import annotations

import pytest

from pointsman_sim.profiles import ProfileError, load_profile, parse_profile, profile_names


def test_ships_both_profiles() -> None:
    assert profile_names() == ["llama-2-7b-a100", "llama-3.1-8b-h100"]


@pytest.mark.parametrize(
    ("name", "chunked", "max_num_seqs", "lora_overhead"),
    [("llama-3.1-8b-h100", True, 1024, 0.05), ("llama-2-7b-a100", False, 256, 0.50)],
)
def test_loads_profile(name: str, chunked: bool, max_num_seqs: int, lora_overhead: float) -> None:
    profile = load_profile(name)
    engine = profile.engine
    assert (engine.chunked_prefill, engine.max_num_seqs, engine.step_time.lora_overhead) == (
        chunked,
        max_num_seqs,
        lora_overhead,
    )
    assert engine.enable_prefix_caching is chunked  # V1 caches prefixes by default, V0 did not
    assert (engine.max_loras, engine.cpu_lora_capacity) == (1, 1)  # vLLM's defaults
    assert profile.vllm_version
    assert profile.model


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param([], "expected a mapping", id="not-a-mapping"),
        pytest.param({"scheduler": "v2"}, "scheduler must be v0 or v1", id="bad-scheduler"),
        pytest.param({"scheduler": "v1", "speed": 1}, "unknown keys ['speed']", id="unknown-key"),
        pytest.param({"scheduler": "v1", "step_time": {"a": 1}}, "in step_time", id="unknown-step-key"),
        pytest.param({"scheduler": "v1", "max_num_seqs": 0}, "max_num_seqs must be at least 1", id="invalid"),
        pytest.param(
            {"scheduler": "v1", "enable_prefix_caching": "yes"},
            "must be true or false",
            id="caching-not-bool",
        ),
    ],
)
def test_rejects_malformed_profiles(data: object, message: str) -> None:
    with pytest.raises(ProfileError, match="profile p: .*" + message.replace("[", r"\[").replace("]", r"\]")):
        parse_profile("p", data)


def test_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(ProfileError, match=r"llama-3\.1-8b-h100"):
        load_profile("gpt-5-b200")
