from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pointsman_devstack.errors import StackError
from pointsman_devstack.stack import (
    SimOptions,
    Stack,
    StackOptions,
    StackPorts,
    derive_config,
    pod_host,
    served_models,
)
from pointsman_shared.config import PointsmanConfig, load_config, parse_config

REPO = Path(__file__).resolve().parents[3]
PORTS = StackPorts(
    gateway=1, envoy_admin=2, pods=(11, 12), collector=3, picker=4, picker_health=5, picker_metrics=6
)


def _config(**doc: Any) -> PointsmanConfig:
    return parse_config({"pool": {"endpoints": ["127.0.0.1:8001", "127.0.0.1:8002"]}} | doc)


def test_the_local_config_serves_the_base_model_and_every_target() -> None:
    config = load_config(REPO / "config/local.yaml", environ={})
    base, adapters = served_models(config)
    assert base == "meta-llama/Llama-3.1-8B-Instruct"
    assert adapters == (
        "tweet-summary-0",
        "tweet-summary-1",
        "tweet-summary-2",
        "tweet-summary-3",
        "sql-lora",
    )
    assert StackPorts.from_config(config) == StackPorts(
        gateway=8080,
        envoy_admin=9901,
        pods=(8001, 8002, 8003),
        collector=9100,
        picker=9002,
        picker_health=9003,
        picker_metrics=9090,
    )


def test_models_without_targets_after_the_first_are_adapters() -> None:
    config = _config(
        models=[
            {"modelName": "base"},
            {"modelName": "lora-a"},
            {"modelName": "x", "targetModels": [{"name": "lora-a"}]},
        ]
    )
    assert served_models(config) == ("base", ("lora-a",))


def test_a_config_without_a_base_model_is_refused() -> None:
    with pytest.raises(StackError, match="no base model"):
        served_models(_config(models=[{"modelName": "x", "targetModels": [{"name": "y"}]}]))


def test_sim_options_take_overrides() -> None:
    config = _config(models=[{"modelName": "base"}, {"modelName": "a"}])
    assert SimOptions.for_config(config, adapters=["z"], max_loras=3) == SimOptions(
        "base", ("z",), max_loras=3
    )


@pytest.mark.parametrize(
    ("endpoints", "message"),
    [
        ([], "pool.endpoints is empty"),
        (["10.0.0.1:8001"], "not loopback"),
        (["localhost:8001"], "not an IP address"),
        (["127.0.0.1:8001", "127.0.0.2:8002"], "on one host"),
    ],
)
def test_pods_must_be_local(endpoints: list[str], message: str) -> None:
    with pytest.raises(StackError, match=message):
        pod_host(_config(pool={"endpoints": endpoints}))


def test_ipv6_loopback_pods_are_fine() -> None:
    assert pod_host(_config(pool={"endpoints": ["[::1]:8001"]})) == "::1"


def test_derived_config_keeps_the_users_settings_and_swaps_ports_and_redis() -> None:
    config = _config(
        models=[{"modelName": "m", "criticality": "Sheddable", "targetModels": [{"name": "t", "weight": 3}]}],
        scheduling={"loraAffinityThreshold": 1.0},
        collector={"interval": "20ms"},
    )
    doc = derive_config(config, PORTS, "redis://127.0.0.1:7777/0", "127.0.0.1")
    derived = parse_config(doc)
    assert derived.pool.endpoints == ("127.0.0.1:11", "127.0.0.1:12")
    assert (derived.collector.listen, derived.picker.listen) == ("127.0.0.1:3", "127.0.0.1:4")
    assert (derived.picker.health_listen, derived.picker.metrics_listen) == ("127.0.0.1:5", "127.0.0.1:6")
    assert derived.redis.url == "redis://127.0.0.1:7777/0"
    unchanged = {
        "pool": {"endpoints"},
        "collector": {"listen"},
        "picker": {"listen", "health_listen", "metrics_listen"},
        "redis": {"url"},
    }
    assert derived.model_copy(update={k: getattr(config, k) for k in unchanged}) == config


def test_the_stack_checks_its_options_before_starting_anything(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("pool: {endpoints: ['127.0.0.1:8001']}\nmodels: [{modelName: base}]\n", encoding="utf-8")
    with pytest.raises(StackError, match=r"2 pod ports for 1 pool\.endpoints"):
        Stack(StackOptions(config_path=path, run_dir=tmp_path / "run", ports=PORTS))
    assert not (tmp_path / "run").exists()


def test_stop_before_start_is_harmless(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("pool: {endpoints: ['127.0.0.1:8001', '127.0.0.1:8002']}\nmodels: [{modelName: base}]\n")
    stack = Stack(StackOptions(config_path=path, run_dir=tmp_path / "run", ports=PORTS))
    stack.stop()
    stack.stop()
    assert stack.pod_addresses == ("127.0.0.1:11", "127.0.0.1:12")
    assert stack.gateway_url == "http://127.0.0.1:1"


def test_collector_replicas_share_the_pool_each_on_its_port() -> None:
    ports = StackPorts(
        gateway=1,
        envoy_admin=2,
        pods=(11, 12),
        collector=3,
        picker=4,
        picker_health=5,
        picker_metrics=6,
        more_collectors=(7, 8),
    )
    assert ports.collectors == (3, 7, 8)
    assert ("collector 3 HTTP", 8) in ports.table()
    doc = derive_config(_config(), ports, "redis://127.0.0.1:7777/0", "127.0.0.1")
    assert parse_config(doc).collector.sharing
    assert not parse_config(derive_config(_config(), PORTS, "redis://x:1/0", "127.0.0.1")).collector.sharing


def test_free_ports_for_replicas_are_distinct() -> None:
    ports = StackPorts.free(2, picker_replicas=2, collector_replicas=3)
    every = [port for _, port in ports.table()]
    assert len(ports.more_collectors) == 2
    assert len(every) == len(set(every))


def test_an_unknown_process_is_named_with_the_ones_there_are(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("pool: {endpoints: ['127.0.0.1:8001', '127.0.0.1:8002']}\nmodels: [{modelName: base}]\n")
    stack = Stack(StackOptions(config_path=path, run_dir=tmp_path / "run", ports=PORTS))
    with pytest.raises(StackError, match=r"no process 'sim-7'; the stack runs \[\]"):
        stack.process("sim-7")
    with pytest.raises(StackError, match="no process 'picker'"):
        stack.restart("picker")
