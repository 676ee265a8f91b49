"""docker-compose.yaml: health checks and start order, build paths and mounts that exist, no port clashes,
and the compose pieces (Pointsman config, Envoy bootstrap, Prometheus targets) agreeing with each other;
the profile `sentinel` (a replica and three Sentinels, the services on a redis+sentinel:// URL) too."""

from __future__ import annotations

import argparse
import ipaddress
import re
from pathlib import Path
from typing import Any

import pytest
from deploy_kit import COMPOSE_FILE, REPO, dockerfile_env, dockerfile_instructions, load_yaml

from pointsman_devstack import deploy
from pointsman_devstack.stack import served_models
from pointsman_shared import upstream
from pointsman_shared.config import load_config, parse_config, split_host_port
from pointsman_shared.redis_url import Sentinel

COMPOSE = load_yaml(COMPOSE_FILE)
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
CONFIG_PATH = "deploy/compose/pointsman.yaml"
CONFIG = load_config(REPO / CONFIG_PATH, environ={})
SIMS = sorted(name for name in SERVICES if name.startswith("sim-"))
SENTINELS = sorted(name for name in SERVICES if name.startswith("sentinel-"))
# The URL the header's command sets (POINTSMAN_COMPOSE_REDIS_URL) for the profile `sentinel`.
SENTINEL_URL = "redis+sentinel://sentinel-1:26379,sentinel-2:26379,sentinel-3:26379/pointsman"


def _host_ports(service: dict[str, Any]) -> list[tuple[str, int]]:
    published = []
    for spec in service.get("ports", []):
        parts = str(spec).split(":")
        host = parts[0] if len(parts) == 3 else "0.0.0.0"
        published.append((host, int(parts[-2])))
    return published


def _mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    return [(spec.split(":")[0], spec.split(":")[1]) for spec in service.get("volumes", [])]


def _dockerfile_service(service: dict[str, Any]) -> str:
    """The services/<name>/ a compose service builds from."""
    return Path(service["build"]["dockerfile"]).parent.name


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_has_a_health_check(name: str) -> None:
    service = SERVICES[name]
    check = service.get("healthcheck", {})
    assert check, name
    assert not check.get("disable"), name
    if "test" in check:
        assert check["test"][0] == "CMD", "exec form: no shell needed in the image"
    else:
        # Compose keeps the image's HEALTHCHECK command when only the timing is given.
        built = _dockerfile_service(service)
        assert [op for op, _args in dockerfile_instructions(built) if op == "HEALTHCHECK"], name


def test_image_health_checks_ask_where_the_compose_config_listens() -> None:
    env = {
        name: {**dockerfile_env(_dockerfile_service(s)), **s.get("environment", {})}
        for name, s in SERVICES.items()
        if "build" in s
    }
    collector_port = split_host_port(CONFIG.collector.listen)[1]
    assert env["collector"]["POINTSMAN_HEALTH_URL"] == f"http://127.0.0.1:{collector_port}/readyz"
    health_port = split_host_port(CONFIG.picker.health_listen)[1]
    for picker in deploy.COMPOSE_PICKERS:
        assert env[picker]["POINTSMAN_HEALTH_ADDRESS"] == f"127.0.0.1:{health_port}"
    for sim in SIMS:
        assert env[sim]["POINTSMAN_HEALTH_URL"] == "http://127.0.0.1:8000/health"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_has_a_pinned_image_or_a_build_that_exists(name: str) -> None:
    service = SERVICES[name]
    if "build" in service:
        build = service["build"]
        assert (REPO / build["context"] / build["dockerfile"]).is_file()
    else:
        image = service["image"]
        assert ":" in image, f"{name}: pin {image} by version"
        assert not image.endswith((":latest", ":main")), f"{name}: pin {image} by version"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_mounted_files_exist(name: str) -> None:
    for source, _target in _mounts(SERVICES[name]):
        assert source.startswith("./"), f"{name}: {source} should be a repository path"
        assert (REPO / source).exists(), f"{name} mounts {source}, which does not exist"


def test_published_ports_do_not_clash() -> None:
    published = [port for service in SERVICES.values() for _host, port in _host_ports(service)]
    assert len(published) == len(set(published)), published


def test_start_order_waits_for_health() -> None:
    for name, service in SERVICES.items():
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in SERVICES, f"{name} depends on unknown {dependency}"
            assert condition["condition"] == "service_healthy", f"{name} -> {dependency}"
            # A service of every profile waits for one of a profile only when that profile is on.
            optional = set(SERVICES[dependency].get("profiles", [])) - set(service.get("profiles", []))
            assert condition.get("required", True) is not bool(optional), f"{name} -> {dependency}"
    assert set(SERVICES["envoy"]["depends_on"]) == set(deploy.COMPOSE_PICKERS)
    for picker in deploy.COMPOSE_PICKERS:
        assert set(SERVICES[picker]["depends_on"]) >= {"collector", "redis"}
    assert set(SERVICES["collector"]["depends_on"]) >= {"redis", *SIMS}


def test_pointsman_services_run_read_only_and_mount_the_compose_config() -> None:
    for name in ("collector", *deploy.COMPOSE_PICKERS, *SIMS):
        assert SERVICES[name]["read_only"] is True, name
        assert SERVICES[name]["cap_drop"] == ["ALL"], name
    for name in ("collector", *deploy.COMPOSE_PICKERS):
        assert (f"./{CONFIG_PATH}", "/etc/pointsman/config.yaml") in _mounts(SERVICES[name])


def test_pool_endpoints_are_the_simulator_containers_fixed_addresses() -> None:
    subnet = ipaddress.ip_network(COMPOSE["networks"]["pointsman"]["ipam"]["config"][0]["subnet"])
    addresses = [SERVICES[name]["networks"]["pointsman"]["ipv4_address"] for name in SIMS]
    assert len(SIMS) == 3
    assert all(ipaddress.ip_address(a) in subnet for a in addresses)
    assert list(CONFIG.pool.endpoints) == [f"{a}:8000" for a in addresses]


@pytest.mark.parametrize("name", SIMS)
def test_simulator_pods_serve_what_the_models_resolve_to(name: str) -> None:
    base, adapters = served_models(CONFIG)
    args = dict(arg.removeprefix("--").split("=", 1) for arg in SERVICES[name]["command"])
    assert args["model"] == base
    assert args["adapters"].split(",") == list(adapters)
    assert args["pod-names"] == name


def test_envoy_mounts_the_generated_bootstrap_and_it_is_up_to_date() -> None:
    assert ("./deploy/envoy/envoy-compose.yaml", "/etc/envoy/envoy.yaml") in _mounts(SERVICES["envoy"])
    expected = deploy.compose_config(CONFIG_PATH, root=REPO)
    actual = (REPO / "deploy/envoy/envoy-compose.yaml").read_text(encoding="utf-8")
    assert actual == expected, "regenerate: .venv/bin/python -m pointsman_devstack.deploy"


def test_envoy_reaches_every_picker_replica_by_name() -> None:
    bootstrap = deploy.compose_bootstrap(deploy.compose_options(CONFIG))
    (cluster,) = [c for c in bootstrap["static_resources"]["clusters"] if c["name"] == "pointsman_picker"]
    assert cluster["type"] == "STRICT_DNS"
    endpoints = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    dialled = {e["endpoint"]["address"]["socket_address"]["address"] for e in endpoints}
    assert dialled == set(deploy.COMPOSE_PICKERS)
    assert dialled <= set(SERVICES)


def test_prometheus_scrapes_collector_pickers_and_pods_where_they_listen() -> None:
    jobs = {
        job["job_name"]: [t for sc in job["static_configs"] for t in sc["targets"]]
        for job in load_yaml(REPO / "deploy/prometheus/prometheus.yaml")["scrape_configs"]
    }
    collector_port = split_host_port(CONFIG.collector.listen)[1]
    picker_port = split_host_port(CONFIG.picker.metrics_listen)[1]
    assert jobs["collector"] == [f"collector:{collector_port}"]
    assert jobs["picker"] == [f"{p}:{picker_port}" for p in deploy.COMPOSE_PICKERS]
    assert jobs["pods"] == [f"{name}:8000" for name in SIMS]
    for targets in jobs.values():
        assert {t.split(":")[0] for t in targets} <= set(SERVICES)


def test_compose_serves_the_models_of_the_local_config() -> None:
    local = load_config(REPO / "config/local.yaml", environ={})
    assert CONFIG.models == local.models
    assert CONFIG.scheduling == local.scheduling


# --- the profile `sentinel` ------------------------------------------------------------------------------


def _interpolated(value: str, environ: dict[str, str]) -> str:
    """``${VAR:-default}`` as compose fills it in from ``environ``."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: environ.get(m.group(1)) or m.group(2), value)


def _sentinel_conf() -> list[list[str]]:
    text = (REPO / "deploy/compose/sentinel.conf").read_text(encoding="utf-8")
    return [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_the_profile_adds_a_replica_and_three_sentinels_only() -> None:
    profiled = {name for name, service in SERVICES.items() if service.get("profiles")}
    assert profiled == {"redis-replica", *SENTINELS}
    assert len(SENTINELS) == 3
    assert all(SERVICES[name]["profiles"] == ["sentinel"] for name in profiled)


def _ip(name: str) -> str:
    address: str = SERVICES[name]["networks"]["pointsman"]["ipv4_address"]
    return address


def test_the_sentinels_watch_the_primary_and_the_replica_follows_it() -> None:
    conf = _sentinel_conf()
    (monitor,) = [line for line in conf if line[:2] == ["sentinel", "monitor"]]
    _, _, master, host, port, quorum = monitor
    assert (host, port) == (_ip("redis"), "6379")
    assert int(quorum) == len(SENTINELS) // 2 + 1  # a majority
    assert ["port", "26379"] in conf
    replica = SERVICES["redis-replica"]["command"]
    assert replica[replica.index("--replicaof") + 1 :][:2] == [_ip("redis"), "6379"]
    for name in SENTINELS:
        assert ("./deploy/compose/sentinel.conf", "/etc/redis/sentinel.conf") in _mounts(SERVICES[name])
        assert "redis-server /tmp/sentinel.conf --sentinel" in SERVICES[name]["command"][-1]
    subnet = ipaddress.ip_network(COMPOSE["networks"]["pointsman"]["ipam"]["config"][0]["subnet"])
    addresses = [_ip(name) for name in ("redis", "redis-replica", *SENTINELS, *SIMS)]
    assert len(set(addresses)) == len(addresses)
    assert all(ipaddress.ip_address(a) in subnet for a in addresses)
    assert master == "pointsman"


def _redis_url(name: str, environ: dict[str, str]) -> str:
    return _interpolated(SERVICES[name]["environment"]["REDIS_URL"], environ)


def test_without_the_profile_the_services_use_the_config_file_s_redis() -> None:
    for name in ("collector", *deploy.COMPOSE_PICKERS):
        assert _redis_url(name, {}) == CONFIG.redis.url


def test_with_the_profile_the_services_ask_the_sentinels() -> None:
    assert SENTINEL_URL in COMPOSE_FILE.read_text(encoding="utf-8")  # the header's command sets it
    (monitor,) = [line for line in _sentinel_conf() if line[:2] == ["sentinel", "monitor"]]
    for name in ("collector", *deploy.COMPOSE_PICKERS):
        url = _redis_url(name, {"POINTSMAN_COMPOSE_REDIS_URL": SENTINEL_URL})
        target = load_config(REPO / CONFIG_PATH, environ={"REDIS_URL": url}).redis.target
        assert target == Sentinel(master_name=monitor[2], hosts=tuple((s, 26379) for s in SENTINELS))
        assert set(SERVICES[name]["depends_on"]) >= set(SENTINELS)


# The Compose Specification's keys this file may use: a misspelt key is ignored by nothing but a schema,
# and there is no compose CLI here to run `docker compose config`.
TOP_LEVEL_KEYS = {"name", "services", "networks", "volumes", "configs", "secrets"}
SERVICE_KEYS = {
    "build", "image", "command", "entrypoint", "environment", "volumes", "ports", "networks", "depends_on",
    "healthcheck", "restart", "read_only", "tmpfs", "cap_drop", "security_opt", "user", "labels", "profiles",
}  # fmt: skip
HEALTHCHECK_KEYS = {"test", "interval", "timeout", "retries", "start_period", "start_interval", "disable"}


def test_only_compose_specification_keys() -> None:
    assert {k for k in COMPOSE if not k.startswith("x-")} <= TOP_LEVEL_KEYS
    for name, service in SERVICES.items():
        assert set(service) <= SERVICE_KEYS, f"{name}: {set(service) - SERVICE_KEYS}"
        assert set(service["healthcheck"]) <= HEALTHCHECK_KEYS, name
        assert set(service.get("build", {})) <= {"context", "dockerfile", "args", "target"}, name
        assert service.get("restart", "no") in {"no", "always", "on-failure", "unless-stopped"}, name


# --- deploy/compose/tracing.yaml: the same stack traced, Jaeger beside it --------------------------------

TRACING = load_yaml(REPO / "deploy/compose/tracing.yaml")["services"]


def _merged(name: str) -> dict[str, Any]:
    """A service as compose merges the override over the base: command replaced, environment and
    depends_on merged by key, volumes by the path in the container."""
    base, extra = SERVICES.get(name, {}), TRACING.get(name, {})
    merged = {**base, **{k: v for k, v in extra.items() if k not in ("environment", "depends_on", "volumes")}}
    merged["environment"] = {**base.get("environment", {}), **extra.get("environment", {})}
    merged["depends_on"] = {**base.get("depends_on", {}), **extra.get("depends_on", {})}
    volumes = {spec.split(":")[1]: spec for spec in [*base.get("volumes", []), *extra.get("volumes", [])]}
    merged["volumes"] = list(volumes.values())
    return merged


def test_the_tracing_override_adds_only_jaeger_and_changes_only_what_tracing_needs() -> None:
    assert set(TRACING) - set(SERVICES) == {"jaeger"}
    jaeger = TRACING["jaeger"]
    assert re.fullmatch(r"jaegertracing/all-in-one:\d+\.\d+\.\d+", jaeger["image"])
    assert set(jaeger["healthcheck"]) <= HEALTHCHECK_KEYS
    assert _host_ports(jaeger) == [("127.0.0.1", 16686)]
    for name, service in TRACING.items():
        assert set(service) <= SERVICE_KEYS, name
        if name != "jaeger":
            assert service["depends_on"] == {"jaeger": {"condition": "service_healthy"}}, name


@pytest.mark.parametrize("name", SIMS)
def test_each_traced_pod_is_its_base_command_plus_the_endpoint(name: str) -> None:
    assert TRACING[name]["command"] == [
        *SERVICES[name]["command"],
        f"--otlp-traces-endpoint={deploy.COMPOSE_OTLP_ENDPOINT}",
    ]


@pytest.mark.parametrize("name", ["collector", "picker-1", "picker-2"])
def test_the_traced_services_load_a_config_that_traces_everything_to_jaeger(name: str) -> None:
    service = _merged(name)
    assert service["command"][:2] == SERVICES[name]["command"][:2]
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    upstream.add_flags(parser, metrics_field="picker.metricsListen")
    args = parser.parse_args(service["command"])
    doc = upstream.with_overrides(load_yaml(REPO / CONFIG_PATH), upstream.overrides(args))
    environ = {k: str(v) for k, v in service["environment"].items() if not str(v).startswith("${")}
    tracing = parse_config(doc, environ=environ).tracing
    assert (tracing.enabled, tracing.endpoint, tracing.ratio) == (True, deploy.COMPOSE_OTLP_ENDPOINT, 1.0)
    assert load_config(REPO / CONFIG_PATH, environ={}).tracing.enabled is False  # the base stays untraced


def test_the_traced_envoy_mounts_its_generated_bootstrap_and_it_is_up_to_date() -> None:
    assert ("./deploy/envoy/envoy-compose-tracing.yaml", "/etc/envoy/envoy.yaml") in _mounts(_merged("envoy"))
    expected = deploy.compose_tracing_config(CONFIG_PATH, root=REPO)
    actual = (REPO / "deploy/envoy/envoy-compose-tracing.yaml").read_text(encoding="utf-8")
    assert actual == expected, (
        "regenerate: .venv/bin/python -m pointsman_devstack.deploy --variant compose-tracing"
    )
    bootstrap = load_yaml(REPO / "deploy/envoy/envoy-compose-tracing.yaml")
    (otlp,) = [c for c in bootstrap["static_resources"]["clusters"] if c["name"] == "otlp"]
    address = otlp["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
        "socket_address"
    ]
    assert (address["address"], address["port_value"]) == ("jaeger", 4317)
    assert "otlp" not in str(
        load_yaml(REPO / "deploy/envoy/envoy-compose.yaml")["static_resources"]["clusters"]
    )
