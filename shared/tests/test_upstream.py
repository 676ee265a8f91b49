"""The upstream endpoint picker's flags and EndpointPickerConfig, as Pointsman config."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pointsman_shared import upstream
from pointsman_shared.config import ConfigError, parse_config

DATA = Path(__file__).parent / "data" / "upstream"
# The args upstream's chart (GIE v1.5.0 epplib _deployment.yaml) gives the picker, for a vLLM pool.
UPSTREAM_ARGS = [
    "--pool-name", "vllm-llama3-8b-instruct",
    "--pool-namespace", "default",
    "--pool-group", "inference.networking.k8s.io",
    "--zap-encoder", "json",
    "--config-file", str(DATA / "default-plugins.yaml"),
    "--tracing=false",
    "--metrics-endpoint-auth=false",
    "-v", "1",
]  # fmt: skip


def parse(
    argv: list[str], metrics_field: str = "picker.metricsListen", *, grpc: bool = True
) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    upstream.add_flags(parser, metrics_field=metrics_field, grpc=grpc)
    return parser.parse_args(argv)


def test_an_upstream_deployment_s_args_parse_and_name_the_pool():
    args = parse(UPSTREAM_ARGS)
    assert args.config == str(DATA / "default-plugins.yaml")
    assert upstream.overrides(args) == {
        "pool": {
            "name": "vllm-llama3-8b-instruct",
            "kubernetes": {"namespace": "default", "apiVersion": "inference.networking.k8s.io/v1"},
        },
        "tracing": {"enabled": False},
    }
    assert upstream.ignored(args) == [
        "--zap-encoder is accepted and not used: logs are text lines",
        "--metrics-endpoint-auth is accepted and not used: the metrics port needs no token",
    ]
    assert upstream.log_level(args, "info") == "INFO"


@pytest.mark.parametrize(
    ("argv", "metrics_field", "expected"),
    [
        (["--grpc-port", "9102"], "picker.metricsListen", {"picker": {"listen": 9102}}),
        (["--grpc-health-port", "9103"], "picker.metricsListen", {"picker": {"healthListen": 9103}}),
        (["--metrics-port", "9190"], "picker.metricsListen", {"picker": {"metricsListen": 9190}}),
        (["--metrics-port", "9190"], "collector.listen", {"collector": {"listen": 9190}}),
        (
            ["--pool-group", "inference.networking.x-k8s.io"],
            "picker.metricsListen",
            {"pool": {"kubernetes": {"apiVersion": "inference.networking.x-k8s.io/v1alpha2"}}},
        ),
        (["--ha-enable-leader-election"], "picker.metricsListen", {}),
        (["--tracing"], "picker.metricsListen", {"tracing": {"enabled": True}}),
        (["--tracing=true"], "collector.listen", {"tracing": {"enabled": True}}),
        (["--tracing", "false"], "picker.metricsListen", {"tracing": {"enabled": False}}),
    ],
)
def test_each_alias_sets_its_field(argv, metrics_field, expected):
    assert upstream.overrides(parse(argv, metrics_field)) == expected


@pytest.mark.parametrize(
    "argv", [["--grpc-port", "0"], ["--grpc-port", "70000"], ["--pool-group", "x"], ["--tracing=maybe"]]
)
def test_bad_values_are_refused(argv):
    with pytest.raises(SystemExit):
        parse(argv)


@pytest.mark.parametrize(
    ("verbosity", "level"), [(None, "WARNING"), ("1", "INFO"), ("3", "INFO"), ("4", "DEBUG")]
)
def test_verbosity_maps_to_a_log_level(verbosity, level):
    args = parse(["-v", verbosity] if verbosity else [])
    assert upstream.log_level(args, "warning") == level


@pytest.mark.parametrize("flag", ["--grpc-port", "--grpc-health-port"])
def test_without_grpc_the_grpc_port_flags_are_refused(flag):
    with pytest.raises(SystemExit):
        parse([flag, "9102"], "collector.listen", grpc=False)


def test_without_grpc_the_other_aliases_still_set_their_fields():
    args = parse(["--metrics-port", "9190", "--pool-name", "p"], "collector.listen", grpc=False)
    assert upstream.overrides(args) == {"pool": {"name": "p"}, "collector": {"listen": 9190}}


def test_a_bare_port_keeps_the_host_of_the_listen_address():
    doc = {"picker": {"listen": "127.0.0.1:9002", "server": "native"}}
    merged = upstream.with_overrides(doc, {"picker": {"listen": 9102, "healthListen": 9103}})
    assert merged == {
        "picker": {"listen": "127.0.0.1:9102", "healthListen": "0.0.0.0:9103", "server": "native"}
    }
    assert doc == {"picker": {"listen": "127.0.0.1:9002", "server": "native"}}  # not changed in place


def test_nested_sections_merge():
    doc = {"pool": {"name": "p", "kubernetes": {"namespace": "a", "kubeconfig": "/k"}}}
    merged = upstream.with_overrides(doc, {"pool": {"kubernetes": {"namespace": "b"}}})
    assert merged["pool"] == {"name": "p", "kubernetes": {"namespace": "b", "kubeconfig": "/k"}}


def test_upstream_s_default_plugins_become_a_scorer_profile(tmp_path):
    config, warnings = upstream.load(DATA / "default-plugins.yaml", extra={}, environ={})
    assert [(p.type, p.ref) for p in config.plugins] == [
        ("queue-scorer", "queue-scorer"),
        ("kv-cache-scorer", "kv-cache-utilization-scorer"),
        ("prefix-cache-scorer", "prefix-cache-scorer"),
    ]
    [profile] = config.profiles
    assert (profile.name, config.picker.profile) == ("default", "default")
    assert [(e.plugin_ref, e.weight) for e in profile.plugins] == [
        ("queue-scorer", 2),
        ("kv-cache-utilization-scorer", 2),
        ("prefix-cache-scorer", 3),
    ]
    assert len(warnings) == 2
    assert not any("prefix-cache" in w for w in warnings)


# The prefix scorer's parameters as each release names them (the release's plugin.go / types.go).
RELEASE_PREFIX_PARAMETERS = {
    "v1.0": {"hashBlockSize": 64, "maxPrefixBlocksToMatch": 256, "lruCapacityPerServer": 31250},
    "v1.2": {"autoTune": True, "blockSize": 64, "maxPrefixBlocksToMatch": 256, "lruCapacityPerServer": 31250},
    "v1.4": {
        "autoTune": False,
        "blockSizeTokens": 16,
        "maxPrefixBlocksToMatch": 256,
        "lruCapacityPerServer": 31250,
    },
    "v1.5": {
        "autoTune": True,
        "blockSizeTokens": 16,
        "maxPrefixTokensToMatch": 4096,
        "lruCapacityPerServer": 31250,
    },
}


@pytest.mark.parametrize("release", sorted(RELEASE_PREFIX_PARAMETERS))
def test_every_release_s_prefix_cache_scorer_is_kept_with_its_parameters(release):
    params = RELEASE_PREFIX_PARAMETERS[release]
    doc = {
        "kind": "EndpointPickerConfig",
        "plugins": [{"type": "queue-scorer"}, {"type": "prefix-cache-scorer", "parameters": params}],
        "schedulingProfiles": [
            {
                "name": "d",
                "plugins": [{"pluginRef": "queue-scorer"}, {"pluginRef": "prefix-cache-scorer", "weight": 3}],
            }
        ],
    }
    translated, warnings = upstream.from_endpoint_picker_config(doc, "epp.yaml")
    assert warnings == []
    config = parse_config(translated)
    [prefix] = [p for p in config.plugins if p.type == "prefix-cache-scorer"]
    # v1.0 had no autoTune: its hashBlockSize is not replaced by the pods' block size
    assert prefix.parameters == ({**params, "autoTune": False} if release == "v1.0" else params)
    assert [(e.plugin_ref, e.weight) for e in config.profiles[0].plugins][-1] == ("prefix-cache-scorer", 3)


def test_flags_and_environment_apply_on_top_of_an_endpoint_picker_config():
    config, _ = upstream.load(
        DATA / "default-plugins.yaml",
        extra={"pool": {"name": "from-flags"}, "picker": {"listen": 9102}},
        environ={"REDIS_URL": "redis://redis.example:6379/0"},
    )
    assert (config.pool.name, config.picker.listen, config.redis.url) == (
        "from-flags",
        "0.0.0.0:9102",
        "redis://redis.example:6379/0",
    )


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        ({"plugins": [{"type": "no-such-scorer"}]}, "plugins[0].type"),
        ({"plugins": "queue-scorer"}, "plugins"),
        ({"schedulingProfiles": [{"name": "p", "plugins": 3}]}, "schedulingProfiles[0].plugins"),
        ({"dataLayer": {}}, "dataLayer"),
        ({"flowControl": [1]}, "flowControl"),
        ({"flowControl": {"priorityBands": 3}}, "flowControl.priorityBands"),
        # Found by test_upstream_properties: each raised TypeError (unhashable, or an int key unsortable).
        ({"plugins": [{"type": ["queue-scorer"]}]}, "plugins[0].type"),
        ({"plugins": [{"type": {"a": 1}}]}, "plugins[0].type"),
        ({1: None, "dataLayer": []}, "1"),
    ],
)
def test_what_cannot_be_translated_is_refused_naming_the_path(doc, path):
    with pytest.raises(ConfigError) as caught:
        upstream.from_endpoint_picker_config({"kind": "EndpointPickerConfig", **doc}, "epp.yaml")
    assert caught.value.problems[0][0] == path


def test_a_plugin_ref_that_is_no_string_is_left_to_the_config_check():
    # Found by test_upstream_properties: `[...] not in dropped` raised TypeError.
    doc = {
        "kind": "EndpointPickerConfig",
        "plugins": [{"type": "single-profile-handler"}],
        "schedulingProfiles": [
            {"name": "p", "plugins": [{"pluginRef": ["x"]}, {"pluginRef": "single-profile-handler"}]}
        ],
    }
    translated, _ = upstream.from_endpoint_picker_config(doc, "epp.yaml")
    assert translated["profiles"] == [{"name": "p", "plugins": [{"pluginRef": ["x"], "weight": 1}]}]
    with pytest.raises(ConfigError) as caught:
        parse_config(translated)
    assert caught.value.problems[0][0] == "profiles[0].plugins[0].pluginRef"


def test_an_endpoint_picker_config_s_flow_control_is_translated():
    doc = {
        "kind": "EndpointPickerConfig",
        "featureGates": ["flowControl"],
        "flowControl": {
            "maxBytes": 1000000,
            "defaultRequestTTL": "20s",
            "priorityBands": [{"priority": 0, "maxBytes": 5000, "priorityName": "critical"}],
            "expiryCleanupInterval": "1s",
        },
        "saturationDetector": {"queueDepthThreshold": 8, "metricsStalenessThreshold": "200ms"},
    }
    translated, warnings = upstream.from_endpoint_picker_config(doc, "epp.yaml")
    config = parse_config(translated)
    flow = config.flow_control
    assert flow.enabled
    assert (flow.max_bytes, flow.default_request_ttl) == (1000000, 20.0)
    assert (flow.priority_bands[0].priority, flow.priority_bands[0].max_bytes) == (0, 5000)
    assert flow.saturation_detector.queue_depth_threshold == 8
    assert any("expiryCleanupInterval" in w for w in warnings)
    assert any("metricsStalenessThreshold" in w for w in warnings)


def test_without_the_gate_or_a_section_flow_control_stays_off():
    translated, warnings = upstream.from_endpoint_picker_config(
        {"kind": "EndpointPickerConfig", "saturationDetector": {"queueDepthThreshold": 8}}, "epp.yaml"
    )
    assert "flowControl" not in translated
    assert not parse_config(translated).flow_control.enabled
    assert any("saturationDetector" in w for w in warnings)


@pytest.mark.parametrize("parameters", ["0", True, [1]], ids=["string", "bool", "list"])
def test_plugin_parameters_that_are_not_a_mapping_are_refused_by_path(parameters):
    doc = {"kind": "EndpointPickerConfig", "plugins": [{"type": "queue-scorer", "parameters": parameters}]}
    translated, _ = upstream.from_endpoint_picker_config(doc, "epp.yaml")
    with pytest.raises(ConfigError, match=r"plugins\[0\]\.parameters"):
        parse_config(translated)
