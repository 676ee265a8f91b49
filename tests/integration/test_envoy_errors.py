"""Envoy's own answers reach clients as JSON errors in the picker's shape, ``{"error": {"code": N,
"message": "..."}}`` with ``content-type: application/json``, status kept: a pod killed mid-request, a
dead pod, no picker, a body too large. The picker's own errors pass unchanged.

A stack of its own (one pod, so the pod can die), since these tests kill its processes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from integration_kit import TEST_CONFIG, completion, stack_environ

from pointsman_devstack import envoy
from pointsman_devstack.stack import SimOptions, Stack, StackOptions, StackPorts
from pointsman_shared.config import load_config

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def one_pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir = Path(tmp_path_factory.mktemp("envoy-errors"))
    doc = yaml.safe_load(TEST_CONFIG.read_text(encoding="utf-8"))
    doc["pool"]["endpoints"] = doc["pool"]["endpoints"][:1]
    config_path = run_dir / "pointsman-one-pod.yaml"
    config_path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    config = load_config(config_path, environ={})
    options = StackOptions(
        config_path=config_path,
        run_dir=run_dir,
        ports=StackPorts.free(1),
        sim=SimOptions.for_config(config, max_loras=4),
        environ=stack_environ(),
    )
    with Stack(options) as running:
        yield running


@pytest.fixture
def client(one_pod: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=one_pod.gateway_url, timeout=30.0) as http:
        yield http


def envoy_error(response: httpx.Response, status: int) -> dict[str, Any]:
    """The error object of one of Envoy's own JSON answers (it names its reason in ``details``)."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json", response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == status
    assert isinstance(error["message"], str)
    assert error["message"]
    assert error["details"]
    return error


def process(stack: Stack, name: str) -> Any:
    (found,) = [p for p in stack.processes if p.name == name]
    return found


def test_the_picker_s_own_errors_pass_unchanged(client: httpx.Client) -> None:
    response = client.post(
        "/v1/completions", content=b"not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    # Exactly the picker's body: not wrapped, no Envoy details.
    (error,) = response.json().values()
    assert set(error) == {"code", "message"}
    assert error["code"] == 400


def test_a_body_too_large_for_envoy_is_a_json_413(one_pod: Stack, client: httpx.Client) -> None:
    # BUFFERED: Envoy holds the whole body, and answers past the listener's buffer limit itself.
    limit = load_config(one_pod.config_file, environ={}).picker.max_body_bytes
    response = client.post("/v1/completions", content=b"x" * (limit + 1024))
    assert envoy_error(response, 413)["message"] == "Payload Too Large"


def test_a_pod_killed_mid_request_is_a_json_503(one_pod: Stack, client: httpx.Client) -> None:
    [pod] = one_pod.pod_addresses
    # The pod holds every request (its engine stops stepping), so the next one is open on it when it dies.
    httpx.post(f"http://{pod}/control", json={"fault": {"paused": True}}, timeout=5).raise_for_status()
    answers: list[httpx.Response] = []
    request = threading.Thread(
        target=lambda: answers.append(client.post("/v1/completions", json=completion("sql-lora")))
    )
    request.start()
    active = f"cluster.{envoy.POD_CLUSTER}.upstream_rq_active"
    deadline = time.monotonic() + 10
    while _stat(one_pod, active) < 1:
        assert time.monotonic() < deadline, "the request never reached the pod"
        time.sleep(0.02)
    process(one_pod, "sim").stop(0)  # SIGKILL: the connection drops before any response
    request.join(timeout=30)
    (killed,) = answers
    error = envoy_error(killed, 503)
    assert error["details"] == "upstream_reset_before_response_started{connection_termination}"
    assert "reset before headers" in error["message"]

    # Dead: Envoy's connection is refused, until the collector has the pod out (then the picker's 503).
    dead = client.post("/v1/completions", json=completion("sql-lora"))
    assert dead.status_code == 503
    assert dead.headers["content-type"] == "application/json"
    assert dead.json()["error"]["code"] == 503


def test_no_picker_is_a_json_503(one_pod: Stack, client: httpx.Client) -> None:
    process(one_pod, "picker").stop(0)
    # Nothing routed the request (failure_mode_allow lets it on, without a destination): no pod.
    error = envoy_error(client.post("/v1/completions", json=completion("sql-lora")), 503)
    assert (error["message"], error["details"]) == ("no healthy upstream", "no_healthy_upstream")


def _stat(stack: Stack, name: str) -> int:
    text = httpx.get(f"{stack.admin_url}/stats", params={"filter": f"^{name}$"}, timeout=5).text
    return sum(int(line.rsplit(":", 1)[1]) for line in text.splitlines() if line.startswith(f"{name}:"))
