from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pointsman_shared.config import (
    ConfigError,
    Criticality,
    FailureMode,
    load_config,
    parse_config,
    split_host_port,
)

REPO = Path(__file__).resolve().parents[2]


def test_an_empty_document_is_all_defaults() -> None:
    config = parse_config({})
    assert config.pool.target_port == 8000
    assert config.pool.failure_mode is FailureMode.FAIL_CLOSE
    assert config.scheduling.kv_cache_threshold == 0.8
    assert config.scheduling.queue_threshold_critical == 5
    assert config.scheduling.queueing_threshold_lora == 128
    assert config.scheduling.lora_affinity_threshold == 0.999
    assert config.collector.interval == 0.05
    assert config.picker.listen == "0.0.0.0:9002"
    assert config.picker.destination_header == "x-gateway-destination-endpoint"
    assert config.picker.metadata_namespace == "envoy.lb"
    assert config.picker.prefill_tokens_per_second == 20_000.0


def test_a_full_document() -> None:
    config = parse_config(
        {
            "apiVersion": "pointsman.dev/v1alpha1",
            "kind": "PointsmanConfig",
            "pool": {
                "name": "p",
                "targetPort": 8000,
                "endpoints": ["10.0.0.1", "10.0.0.2:9000", "[fd00::1]"],
                "endpointsFile": "/etc/pointsman/endpoints",
            },
            "models": [
                {
                    "modelName": "tweet",
                    "criticality": "Critical",
                    "targetModels": [{"name": "tweet-0", "weight": 50}, {"name": "tweet-1", "weight": 50}],
                },
                {"modelName": "base"},
            ],
            "scheduling": {"queueingThresholdLoRA": 50, "kvCacheThreshold": 0.9},
            "collector": {"interval": "100ms", "timeout": "1s", "listen": "127.0.0.1:9100"},
        }
    )
    assert config.pool.endpoints == ("10.0.0.1:8000", "10.0.0.2:9000", "[fd00::1]:8000")
    assert config.pool.endpoints_file == "/etc/pointsman/endpoints"
    assert config.models[0].criticality is Criticality.CRITICAL
    assert [t.weight for t in config.models[0].target_models] == [50, 50]
    assert config.models[1].criticality is None
    assert config.scheduling.queueing_threshold_lora == 50
    assert config.collector.interval == pytest.approx(0.1)


def _problems(doc: dict[str, Any], environ: dict[str, str] | None = None) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as excinfo:
        parse_config(doc, environ=environ)
    return excinfo.value.problems


@pytest.mark.parametrize(
    ("doc", "path", "message"),
    [
        ({"apiVersion": "v2"}, "apiVersion", "pointsman.dev/v1alpha1"),
        ({"kind": "Other"}, "kind", "PointsmanConfig"),
        ({"pool": {"targetPort": 0}}, "pool.targetPort", "greater than 0"),
        ({"pool": {"endpoints": ["a:1", "b:x"]}}, "pool.endpoints[1]", "bad port"),
        ({"pool": {"endpoints": ["a:1", "a:1"]}}, "pool.endpoints[1]", "listed twice"),
        ({"pool": {"failureMode": "Maybe"}}, "pool.failureMode", "FailOpen"),
        ({"models": [{"modelName": "m", "criticality": "High"}]}, "models[0].criticality", "Critical"),
        (
            {"models": [{"modelName": "m", "criticality": "Critical", "priority": 1}]},
            "models[0].priority",
            "not both",
        ),
        (
            {"models": [{"modelName": "m", "targetModels": [{"name": "a", "weight": 0}]}]},
            "models[0].targetModels[0].weight",
            "greater than or equal to 1",
        ),
        (
            {"models": [{"modelName": "m", "targetModels": [{"name": "a", "weight": 1}, {"name": "b"}]}]},
            "models[0].targetModels",
            "every target model or on none",
        ),
        (
            {"models": [{"modelName": "m", "targetModels": [{"name": f"t{i}"} for i in range(11)]}]},
            "models[0].targetModels",
            "at most 10",
        ),
        ({"models": [{"modelName": "m"}, {"modelName": "m"}]}, "models[1].modelName", "declared twice"),
        ({"scheduling": {"kvCacheThreshold": 1.5}}, "scheduling.kvCacheThreshold", "less than or equal to 1"),
        ({"scheduling": {"queueingThresholdLora": 5}}, "scheduling.queueingThresholdLora", "not permitted"),
        ({"redis": {"url": "http://x"}}, "redis.url", "redis://"),
        ({"collector": {"interval": "fast"}}, "collector.interval", "not a duration"),
        ({"collector": {"interval": "0ms"}}, "collector.interval", "greater than 0"),
        ({"collector": {"maxFailures": 0}}, "collector.maxFailures", "greater than or equal to 1"),
        ({"picker": {"listen": "nohost"}}, "picker.listen", "no port"),
        ({"picker": {"prefillTokensPerSecond": 0}}, "picker.prefillTokensPerSecond", "greater than 0"),
        ({"pool": {"nme": "typo"}}, "pool.nme", "not permitted"),
        ({"pool": {"kubernetes": {"apiVersion": "v9"}}}, "pool.kubernetes.apiVersion", "v1alpha2"),
    ],
)
def test_errors_name_the_path(doc: dict[str, Any], path: str, message: str) -> None:
    problems = _problems(doc)
    assert any(p == path and message in m for p, m in problems), problems


def test_kubernetes_discovery_reads_the_v1_pool_by_default() -> None:
    pool = parse_config({"pool": {"kubernetes": {}}}).pool
    assert pool.kubernetes is not None
    assert pool.kubernetes.api_version == "inference.networking.k8s.io/v1"
    assert (pool.kubernetes.inference_pool, pool.kubernetes.namespace, pool.kubernetes.kubeconfig) == (
        None,
    ) * 3
    assert parse_config({}).pool.kubernetes is None


@pytest.mark.parametrize(
    "api_version", ["inference.networking.k8s.io/v1", "inference.networking.x-k8s.io/v1alpha2"]
)
def test_kubernetes_discovery_takes_either_inference_pool_version(api_version: str) -> None:
    pool = parse_config({"pool": {"kubernetes": {"apiVersion": api_version}}}).pool
    assert pool.kubernetes is not None
    assert pool.kubernetes.api_version == api_version


def test_all_problems_are_reported_at_once() -> None:
    problems = _problems({"pool": {"targetPort": -1}, "scheduling": {"kvCacheThreshold": 2}})
    assert {p for p, _ in problems} == {"pool.targetPort", "scheduling.kvCacheThreshold"}


def test_environment_overrides_thresholds_and_redis() -> None:
    environ = {
        "KV_CACHE_THRESHOLD": "0.5",
        "QUEUE_THRESHOLD_CRITICAL": "7",
        "QUEUING_THRESHOLD_LORA": "64",
        "LORA_AFFINITY_THRESHOLD": "0.9",
        "REDIS_URL": "redis://elsewhere:6380/1",
    }
    config = parse_config({"scheduling": {"kvCacheThreshold": 0.7}}, environ=environ)
    assert config.scheduling.kv_cache_threshold == 0.5
    assert config.scheduling.queue_threshold_critical == 7
    assert config.scheduling.queueing_threshold_lora == 64
    assert config.scheduling.lora_affinity_threshold == 0.9
    assert config.redis.url == "redis://elsewhere:6380/1"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "not a duration"),  # `staleness:` left empty in YAML
        ([], "not a duration"),
        ({"s": 1}, "not a duration"),
        (10**400, "too large"),
        ("9" * 400 + "s", "must be finite"),
        (float("inf"), "must be finite"),
    ],
)
def test_a_duration_of_any_wrong_type_names_its_path(value: object, message: str) -> None:
    # Found by test_config_properties: a TypeError or OverflowError escaped parse_config.
    [(path, problem)] = _problems({"collector": {"staleness": value}})
    assert path == "collector.staleness"
    assert message in problem


@pytest.mark.parametrize("value", [float("inf"), "1e400", float("nan")])
def test_a_number_that_is_not_finite_is_refused(value: object) -> None:
    # Found by test_config_properties: prefillTokensPerSecond "1e400" was an infinite rate.
    assert _problems({"picker": {"prefillTokensPerSecond": value}}) == [
        ("picker.prefillTokensPerSecond", "Input should be a finite number")
    ]


@pytest.mark.parametrize(("key", "path"), [("", "''"), ("pool.name", "'pool.name'"), ("a b", "'a b'")])
def test_a_key_that_reads_as_another_path_is_quoted(key: str, path: str) -> None:
    assert _problems({key: 1}) == [(path, "Extra inputs are not permitted")]


def test_a_bad_environment_override_names_the_key() -> None:
    problems = _problems({}, environ={"KV_CACHE_THRESHOLD": "lots"})
    assert problems[0][0] == "scheduling.kvCacheThreshold"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("pool: [1", "not valid YAML"),
        ("- a\n- b\n", "must be a mapping"),
        # Found by test_config_properties: PyYAML raised ValueError, AttributeError or RecursionError.
        ("pool: {name: 2001-02-30}", "not valid YAML: ValueError"),
        ("pool: !!timestamp soon", "not valid YAML: AttributeError"),
        ("pool: " + "[" * 600, "not valid YAML: RecursionError"),
    ],
)
def test_load_refuses_bad_files(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=problem):
        load_config(path)


def test_load_reports_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")


def test_the_shipped_local_config_is_valid() -> None:
    config = load_config(REPO / "config" / "local.yaml", environ={})
    assert config.pool.endpoints
    assert config.models


@pytest.mark.parametrize(
    ("text", "default", "expected"),
    [("h:1", None, ("h", 1)), ("h", 80, ("h", 80)), ("[::1]:9", None, ("::1", 9)), ("[::1]", 7, ("::1", 7))],
)
def test_split_host_port(text: str, default: int | None, expected: tuple[str, int]) -> None:
    assert split_host_port(text, default) == expected


@pytest.mark.parametrize("text", ["", ":80", "h:", "h:99999", "::1:80", "[::1]x"])
def test_split_host_port_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="address"):
        split_host_port(text, None)
