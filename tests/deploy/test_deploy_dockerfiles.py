"""The services' Dockerfiles: multi-stage on a pinned slim base, the lock's versions, a non-root user, and
health checks that really pass against the running services."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata

import pytest
from deploy_kit import REPO, SERVICES, dockerfile_instructions
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pointsman_devstack.stack import Stack


def _healthcheck_command(service: str) -> list[str]:
    (healthcheck,) = [args for op, args in dockerfile_instructions(service) if op == "HEALTHCHECK"]
    command: list[str] = json.loads(healthcheck[healthcheck.index("CMD [") + len("CMD ") :])
    return command


@pytest.mark.parametrize("service", SERVICES)
def test_multi_stage_on_a_pinned_slim_python(service: str) -> None:
    steps = dockerfile_instructions(service)
    (base,) = [args for op, args in steps if op == "ARG" and args.startswith("PYTHON_IMAGE=")]
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.11\.\d+-slim-\w+", base), base
    assert [args for op, args in steps if op == "FROM"] == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]
    assert any(op == "COPY" and args.startswith("--from=build ") for op, args in steps)


@pytest.mark.parametrize("service", SERVICES)
def test_installs_only_the_lock_s_versions_without_a_resolver_surprise(service: str) -> None:
    run = " ".join(args for op, args in dockerfile_instructions(service) if op == "RUN")
    assert "--constraint requirements/runtime.txt" in run
    assert "--only-binary=:all:" in run
    assert " check" in run
    # Our own packages as paths: a bare `shared` would be looked up on PyPI.
    assert f"./services/{service}" in run
    assert "./shared" in run


@pytest.mark.parametrize("service", SERVICES)
def test_copies_only_paths_that_exist(service: str) -> None:
    for op, args in dockerfile_instructions(service):
        if op == "COPY" and not args.startswith("--from"):
            source, _target = args.split()
            assert (REPO / source).exists(), source
    ignore = (REPO / "services" / service / "Dockerfile.dockerignore").read_text(encoding="utf-8")
    assert f"!services/{service}/" in ignore.splitlines()


@pytest.mark.parametrize("service", SERVICES)
def test_runs_as_a_numeric_non_root_user(service: str) -> None:
    users = [args for op, args in dockerfile_instructions(service) if op == "USER"]
    assert users, "no USER: the image would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit()
    assert uid != "0"


@pytest.mark.parametrize("service", SERVICES)
def test_says_how_big_the_image_should_be(service: str) -> None:
    text = (REPO / "services" / service / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^# Expected size: ~\d+ MB", text, re.MULTILINE)


def _run_healthcheck(service: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = _healthcheck_command(service)
    assert command[0] == "python"
    return subprocess.run(
        [sys.executable, *command[1:]],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_health_checks_pass_against_the_running_services(stack: Stack) -> None:
    ports = stack.ports
    checks = {
        "collector": {"POINTSMAN_HEALTH_URL": f"{stack.collector_url}/healthz"},
        "picker": {"POINTSMAN_HEALTH_ADDRESS": f"127.0.0.1:{ports.picker_health}"},
        "simulator": {"POINTSMAN_HEALTH_URL": f"http://{stack.pod_addresses[0]}/health"},
    }
    for service, env in checks.items():
        result = _run_healthcheck(service, env)
        assert result.returncode == 0, f"{service}: {result.stderr}"


def test_health_checks_fail_where_nothing_answers(stack: Stack) -> None:
    # Envoy's admin port speaks HTTP/1, so the gRPC check must fail there; a 404 fails the HTTP checks.
    closed = {
        "collector": {"POINTSMAN_HEALTH_URL": f"{stack.admin_url}/no-such-page"},
        "picker": {"POINTSMAN_HEALTH_ADDRESS": f"127.0.0.1:{stack.ports.envoy_admin}"},
        "simulator": {"POINTSMAN_HEALTH_URL": f"{stack.admin_url}/no-such-page"},
    }
    for service, env in closed.items():
        assert _run_healthcheck(service, env).returncode != 0, service


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements/runtime.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def _closure(distribution: str) -> set[str]:
    """``distribution`` and everything it needs on this interpreter (extras asked for included)."""
    done: set[tuple[str, frozenset[str]]] = set()
    todo = [(distribution, frozenset[str]())]
    while todo:
        name, extras = todo.pop()
        key = (canonicalize_name(name), extras)
        if key in done:
            continue
        done.add(key)
        for text in metadata.requires(name) or []:
            requirement = Requirement(text)
            environments = [{"extra": e} for e in extras] or [{"extra": ""}]
            if requirement.marker is None or any(requirement.marker.evaluate(env) for env in environments):
                todo.append((requirement.name, frozenset(requirement.extras)))
    return {name for name, _extras in done}


@pytest.mark.parametrize("service", SERVICES)
def test_the_lock_pins_everything_the_image_installs(service: str) -> None:
    # The image installs our wheels with the lock as constraints: a dependency the lock does not name
    # would come in at whatever version is newest on the day of the build.
    pins = _pins()
    ours = {"pointsman-shared", "pointsman-collector", "pointsman-picker", "pointsman-sim"}
    distribution = {
        "collector": "pointsman-collector",
        "picker": "pointsman-picker",
        "simulator": "pointsman-sim",
    }
    needed = _closure(distribution[service]) | {"uvloop"}
    missing = sorted(needed - ours - set(pins))
    assert not missing, f"add to requirements/runtime.txt: {missing}"
    for name in needed - ours:
        assert metadata.version(name) == pins[name], name
