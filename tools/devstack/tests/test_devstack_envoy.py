from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pointsman_devstack import envoy
from pointsman_shared.config import parse_config

REPO = Path(__file__).resolve().parents[3]


def _options(**overrides: Any) -> envoy.EnvoyOptions:
    base: dict[str, Any] = {
        "gateway_listen": "127.0.0.1:18080",
        "admin_listen": "127.0.0.1:19901",
        "pickers": ("127.0.0.1:19002",),
    }
    return envoy.EnvoyOptions(**(base | overrides))


def _ext_proc(config: dict[str, Any]) -> dict[str, Any]:
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    first = hcm["http_filters"][0]
    assert first["name"] == "envoy.filters.http.ext_proc"
    return dict(first["typed_config"])


def _hcm(config: dict[str, Any]) -> dict[str, Any]:
    return dict(config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"])


def _cluster(config: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in config["static_resources"]["clusters"] if c["name"] == name]
    return dict(found)


def test_reference_config_is_up_to_date() -> None:
    expected = envoy.reference_config("config/local.yaml", root=REPO)
    actual = (REPO / "deploy/envoy/envoy.yaml").read_text(encoding="utf-8")
    assert actual == expected, (
        "deploy/envoy/envoy.yaml is stale: run "
        "`.venv/bin/python -m pointsman_devstack.envoy --config config/local.yaml > deploy/envoy/envoy.yaml`"
    )


@pytest.mark.parametrize(
    "options",
    [
        pytest.param(_options(), id="one-picker"),
        pytest.param(_options(pickers=("127.0.0.1:19002", "127.0.0.1:19012")), id="two-pickers"),
        pytest.param(
            _options(destination_header="x-pod", metadata_namespace="pointsman.lb", max_body_bytes=1024),
            id="renamed",
        ),
        pytest.param(_options(gateway_listen="[::1]:18080", pickers=("[::1]:19002",)), id="ipv6"),
        pytest.param(_options(request_body_mode="BUFFERED"), id="buffered"),
        pytest.param(_options(request_body_mode="FULL_DUPLEX_STREAMED"), id="full-duplex"),
        pytest.param(_options(request_body_mode="STREAMED", body_without_waiting=True), id="early-body"),
        pytest.param(_options(response_processing=False), id="requests-only"),
        pytest.param(_options(response_body=envoy.RESPONSE_STREAMED), id="streamed-bodies"),
        pytest.param(_options(response_body=envoy.NO_BODY), id="headers-only"),
    ],
)
def test_envoy_accepts_every_generated_config(options: envoy.EnvoyOptions, tmp_path: Path) -> None:
    envoy.validate(envoy.write_bootstrap(options, tmp_path / "envoy.yaml"))


def test_envoy_accepts_the_reference_config() -> None:
    envoy.validate(REPO / "deploy/envoy/envoy.yaml")


def test_validate_reports_what_envoy_rejects(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("static_resources: {clusters: [{name: x, type: NO_SUCH_TYPE}]}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="NO_SUCH_TYPE"):
        envoy.validate(path)


def test_ext_proc_matches_the_picker_contract() -> None:
    ext_proc = _ext_proc(envoy.bootstrap(_options(metadata_namespace="envoy.lb")))
    assert ext_proc["processing_mode"] == {
        "request_header_mode": "SEND",
        "response_header_mode": "SEND",
        "request_body_mode": "BUFFERED",
        # The body's size and usage come through the Lua filter and the access log instead.
        "response_body_mode": "NONE",
        "request_trailer_mode": "SKIP",
        "response_trailer_mode": "SKIP",
    }
    # Safe: a request the picker never answered has no destination header, so it finds no pod.
    assert ext_proc["failure_mode_allow"] is True
    assert ext_proc["grpc_service"]["envoy_grpc"] == {"cluster_name": envoy.PICKER_CLUSTER}
    retry = ext_proc["grpc_service"]["retry_policy"]
    # reset: a stream whose picker died before it answered is replayed to another picker.
    assert retry["retry_on"] == "connect-failure,refused-stream,unavailable,reset"
    assert retry["retry_host_predicate"][0]["name"] == "envoy.retry_host_predicates.previous_hosts"
    namespaces = ["envoy.lb", envoy.ROUTE_NAMESPACE]  # the route: what the access log entry is counted under
    assert ext_proc["metadata_options"] == {"receiving_namespaces": {"untyped": namespaces}}


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"response_processing": False}, {"response_header_mode": "SKIP", "response_body_mode": "NONE"}),
        ({"response_body": "none"}, {"response_header_mode": "SEND", "response_body_mode": "NONE"}),
        ({"response_body": "streamed"}, {"response_header_mode": "SEND", "response_body_mode": "STREAMED"}),
        (
            {"request_body_mode": "FULL_DUPLEX_STREAMED"},
            {"request_body_mode": "FULL_DUPLEX_STREAMED", "request_trailer_mode": "SEND"},
        ),
        (
            {"request_body_mode": "STREAMED", "body_without_waiting": True},
            {"request_body_mode": "STREAMED", "request_trailer_mode": "SEND"},
        ),
        # Without STREAMED the flag means nothing to Envoy, and is left out.
        ({"body_without_waiting": True}, {"request_body_mode": "BUFFERED", "request_trailer_mode": "SKIP"}),
    ],
)
def test_processing_mode_variants(overrides: dict[str, Any], expected: dict[str, str]) -> None:
    ext_proc = _ext_proc(envoy.bootstrap(_options(**overrides)))
    mode = ext_proc["processing_mode"]
    assert {key: mode[key] for key in expected} == expected
    early = ext_proc.get("send_body_without_waiting_for_header_response", False)
    assert early is (mode["request_body_mode"] == "STREAMED")


@pytest.mark.parametrize(
    ("overrides", "filters", "logs"),
    [
        ({}, ["ext_proc", "lua", "router"], ["stdout", "http_grpc"]),
        ({"response_body": "streamed"}, ["ext_proc", "router"], ["stdout"]),
        ({"response_body": "none"}, ["ext_proc", "router"], ["stdout"]),
        ({"response_processing": False}, ["ext_proc", "router"], ["stdout"]),
    ],
)
def test_the_usage_filter_and_the_access_log_come_together(
    overrides: dict[str, Any], filters: list[str], logs: list[str]
) -> None:
    hcm = _hcm(envoy.bootstrap(_options(**overrides)))
    assert [f["name"].removeprefix("envoy.filters.http.") for f in hcm["http_filters"]] == filters
    assert [log["name"].removeprefix("envoy.access_loggers.") for log in hcm["access_log"]] == logs
    if "lua" in filters:
        # The one source, embedded whole; its log goes to the pickers.
        assert hcm["http_filters"][1] == envoy.usage_filter()
        assert "envoy_on_response" in envoy.usage_lua()
        grpc_log = hcm["access_log"][1]["typed_config"]["common_config"]
        assert grpc_log["grpc_service"] == {"envoy_grpc": {"cluster_name": envoy.PICKER_CLUSTER}}
        assert grpc_log["transport_api_version"] == "V3"


def test_an_unknown_response_body_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="response_body"):
        _options(response_body="buffered")


@pytest.mark.parametrize(
    ("overrides", "body_mode"),
    [
        # With responses shown to the picker, Envoy 1.40 fails a FULL_DUPLEX_STREAMED request whose picker
        # dies after routing it; a BUFFERED one carries on (docs/envoy.md, "Body modes").
        ({}, "BUFFERED"),
        # Without, Envoy closes the stream once the request is routed: the picker's death cannot touch it.
        ({"response_processing": False}, "FULL_DUPLEX_STREAMED"),
        ({"request_body_mode": "FULL_DUPLEX_STREAMED"}, "FULL_DUPLEX_STREAMED"),
        ({"request_body_mode": "BUFFERED", "response_processing": False}, "BUFFERED"),
    ],
)
def test_the_default_body_mode_is_the_one_that_survives_a_picker_s_death(
    overrides: dict[str, Any], body_mode: str
) -> None:
    options = _options(**overrides)
    assert options.body_mode == body_mode
    assert _ext_proc(envoy.bootstrap(options))["processing_mode"]["request_body_mode"] == body_mode


def test_envoy_s_own_replies_are_json_in_the_picker_s_shape() -> None:
    local_reply = _hcm(envoy.bootstrap(_options()))["local_reply_config"]
    assert local_reply == envoy.local_reply_config()
    # Status kept (no status_code rewrite), the body an error object like the picker's.
    assert local_reply["body_format"]["json_format"] == {
        "error": {
            "code": "%RESPONSE_CODE%",
            "message": "%LOCAL_REPLY_BODY%",
            "details": "%RESPONSE_CODE_DETAILS%",
        }
    }
    picker, ext_proc_failed = local_reply["mappers"]
    assert all("status_code" not in mapper for mapper in local_reply["mappers"])
    # The picker's ImmediateResponses (details "pointsman_<result>") are JSON already: passed as they are.
    assert picker["filter"]["extension_filter"]["typed_config"]["expression"] == (
        "response.code_details.startsWith('pointsman_')"
    )
    assert picker["body_format_override"] == {
        "text_format_source": {"inline_string": "%LOCAL_REPLY_BODY%"},
        "content_type": "application/json",
    }
    # ext_proc's own failures come without a body: they get a message.
    assert "ext_proc_error" in ext_proc_failed["filter"]["extension_filter"]["typed_config"]["expression"]
    assert ext_proc_failed["body_format_override"]["json_format"]["error"]["message"]


def test_the_picker_cluster_takes_every_stream_in_flight_and_retries_them_all() -> None:
    picker = _cluster(envoy.bootstrap(_options()), envoy.PICKER_CLUSTER)
    (limits,) = picker["circuit_breakers"]["thresholds"]
    # Envoy's defaults: 1024 requests (one stream per request in flight), 3 retries at once.
    assert limits["max_requests"] >= 40000
    assert limits["max_retries"] == envoy.MAX_PICKER_RETRIES >= 1000
    (check,) = picker["health_checks"]
    # Else Envoy checks every 60 s until the cluster has carried traffic (its first minute).
    assert check["no_traffic_interval"] == check["interval"]


def test_a_picker_that_refuses_connections_is_ejected_at_once() -> None:
    outliers = _cluster(envoy.bootstrap(_options()), envoy.PICKER_CLUSTER)["outlier_detection"]
    assert outliers["split_external_local_origin_errors"] is True
    assert outliers["consecutive_local_origin_failure"] == 1


def test_pods_are_routed_by_the_destination_header() -> None:
    config = envoy.bootstrap(_options(destination_header="x-pod"))
    pods = _cluster(config, envoy.POD_CLUSTER)
    assert pods["type"] == "ORIGINAL_DST"
    assert pods["lb_policy"] == "CLUSTER_PROVIDED"
    assert pods["original_dst_lb_config"] == {"use_http_header": True, "http_header_name": "x-pod"}
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    (early,) = hcm["early_header_mutation_extensions"]
    assert early["typed_config"]["mutations"] == [{"remove": "x-pod"}]


def test_every_picker_is_an_http2_endpoint() -> None:
    config = envoy.bootstrap(_options(pickers=("127.0.0.1:1", "[::1]:2")))
    picker = _cluster(config, envoy.PICKER_CLUSTER)
    options = picker["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ]
    assert options["explicit_http_config"] == {"http2_protocol_options": {}}
    (check,) = picker["health_checks"]
    assert check["grpc_health_check"] == {"service_name": "envoy.service.ext_proc.v3.ExternalProcessor"}
    endpoints = picker["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert [e["endpoint"]["address"]["socket_address"] for e in endpoints] == [
        {"address": "127.0.0.1", "port_value": 1},
        {"address": "::1", "port_value": 2},
    ]


def test_options_follow_the_pointsman_config() -> None:
    config = parse_config(
        {
            "picker": {
                "listen": "0.0.0.0:7002",
                "destinationHeader": "x-pod",
                "metadataNamespace": "ns",
                "maxBodyBytes": 100,
            }
        }
    )
    options = envoy.EnvoyOptions.from_config(config, gateway_listen="127.0.0.1:1", admin_listen="127.0.0.1:2")
    assert options.pickers == ("127.0.0.1:7002",)
    assert (options.destination_header, options.metadata_namespace, options.max_body_bytes) == (
        "x-pod",
        "ns",
        100,
    )
    listener = envoy.bootstrap(options)["static_resources"]["listeners"][0]
    assert listener["per_connection_buffer_limit_bytes"] == 100


@pytest.mark.parametrize(
    ("listen", "dial"),
    [("0.0.0.0:9002", "127.0.0.1:9002"), ("[::]:9002", "[::1]:9002"), ("10.0.0.5:9002", "10.0.0.5:9002")],
)
def test_dial_address_turns_a_wildcard_into_loopback(listen: str, dial: str) -> None:
    assert envoy.dial_address(listen) == dial
