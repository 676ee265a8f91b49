from __future__ import annotations

import pytest

from pointsman_sim.__main__ import build_parser, pod_specs, requested_ports


@pytest.mark.parametrize(
    ("argv", "ports", "names", "adapters"),
    [
        pytest.param([], [8000], ["127.0.0.1:8000"], (), id="defaults"),
        pytest.param(
            ["--ports", "8001,8002", "--adapters", "a,b"],
            [8001, 8002],
            ["127.0.0.1:8001", "127.0.0.1:8002"],
            ("a", "b"),
            id="ports-and-adapters",
        ),
        pytest.param(
            [
                "--host",
                "0.0.0.0",
                "--port",
                "9000",
                "--pod-names",
                "10.0.0.7:9000",
                "--lora-modules",
                "sql=/x",
                "t",
            ],
            [9000],
            ["10.0.0.7:9000"],
            ("sql", "t"),
            id="vllm-style",
        ),
    ],
)
def test_pod_specs(argv: list[str], ports: list[int], names: list[str], adapters: tuple[str, ...]) -> None:
    args = build_parser().parse_args(argv)
    assert requested_ports(args) == ports
    specs = pod_specs(args, ports)
    assert [s.name for s in specs] == names
    assert {s.adapters for s in specs} == {adapters}


@pytest.mark.parametrize(
    ("argv", "caching"),
    [
        pytest.param([], True, id="v1-default-on"),
        pytest.param(["--no-enable-prefix-caching"], False, id="off"),
        pytest.param(["--profile", "llama-2-7b-a100"], False, id="v0-default-off"),
        pytest.param(["--profile", "llama-2-7b-a100", "--enable-prefix-caching"], True, id="v0-on"),
    ],
)
def test_prefix_caching_flag(argv: list[str], caching: bool) -> None:
    (spec,) = pod_specs(build_parser().parse_args(argv), [8000])
    assert spec.engine.enable_prefix_caching is caching


def test_engine_flags_reach_the_engine_config() -> None:
    argv = ["--max-loras", "2", "--max-num-seqs", "8", "--num-gpu-blocks-override", "100", "--speedup", "50"]
    (spec,) = pod_specs(build_parser().parse_args(argv), [8000])
    assert (spec.engine.max_loras, spec.engine.max_num_seqs, spec.engine.num_gpu_blocks) == (2, 8, 100)
    assert spec.speedup == 50.0


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--ports", "1,2", "--pod-names", "a"], id="names-per-port"),
        pytest.param(["--adapters", "a,a"], id="repeated-adapter"),
        pytest.param(["--max-num-seqs", "0"], id="no-batch"),
        pytest.param(["--max-loras", "4", "--max-cpu-loras", "2"], id="cpu-cache-below-slots"),
    ],
)
def test_pod_specs_rejects(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    with pytest.raises(ValueError):  # noqa: PT011  # the message is for humans
        pod_specs(args, requested_ports(args))


@pytest.mark.parametrize(
    ("argv", "model", "chunked", "max_loras", "max_num_seqs"),
    [
        pytest.param([], "meta-llama/Llama-3.1-8B-Instruct", True, 1, 1024, id="default-profile"),
        pytest.param(["--profile", "llama-2-7b-a100"], "meta-llama/Llama-2-7b-hf", False, 1, 256, id="a100"),
        pytest.param(
            ["--profile", "llama-2-7b-a100", "--model", "m", "--max-loras", "3", "--max-num-seqs", "9"],
            "m",
            False,
            3,
            9,
            id="flags-override-the-profile",
        ),
    ],
)
def test_profile_sets_the_engine(
    argv: list[str], model: str, chunked: bool, max_loras: int, max_num_seqs: int
) -> None:
    (spec,) = pod_specs(build_parser().parse_args(argv), [8000])
    assert (spec.model, spec.engine.chunked_prefill) == (model, chunked)
    assert (spec.engine.max_loras, spec.engine.max_num_seqs) == (max_loras, max_num_seqs)


def test_metrics_flags_reach_the_pod_spec() -> None:
    argv = ["--metrics-version", "v0", "--lora-info-labels", "current", "--max-cpu-loras", "3"]
    (spec,) = pod_specs(build_parser().parse_args(argv), [8000])
    assert (spec.metrics_version, spec.lora_info_labels, spec.engine.cpu_lora_capacity) == (
        "v0",
        "current",
        3,
    )
