"""Requests through Envoy: what the client sees, and which pod served it."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml
from integration_kit import POD_HEADER, Pool, completion

from pointsman_devstack.stack import Stack

pytestmark = pytest.mark.integration

BASE = "meta-llama/Llama-3.1-8B-Instruct"


def test_a_completion_returns_json_from_a_pod(gateway: httpx.Client, stack: Stack, pool: Pool) -> None:
    response = gateway.post("/v1/completions", json=completion(BASE))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert response.headers[POD_HEADER] in stack.pod_addresses
    body = response.json()
    assert body["model"] == BASE
    assert body["choices"][0]["text"]
    assert body["usage"]["completion_tokens"] == 4


def test_a_chat_completion_goes_through_too(gateway: httpx.Client, stack: Stack, pool: Pool) -> None:
    request = {"model": BASE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    response = gateway.post("/v1/chat/completions", json=request)
    assert response.status_code == 200, response.text
    assert response.headers[POD_HEADER] in stack.pod_addresses
    assert response.json()["choices"][0]["message"]["content"]


def test_a_stream_comes_back_as_server_sent_events(gateway: httpx.Client, stack: Stack, pool: Pool) -> None:
    request = completion("sql-lora", max_tokens=8, stream=True, stream_options={"include_usage": True})
    with gateway.stream("POST", "/v1/completions", json=request) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers[POD_HEADER] in stack.pod_addresses
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) >= 2  # the tokens came as several events, not one buffered body
    assert chunks[-1]["usage"]["completion_tokens"] == 8
    assert {c["model"] for c in chunks} == {"sql-lora"}


def test_a_model_with_targets_is_rewritten_to_one_of_them(gateway: httpx.Client, pool: Pool) -> None:
    targets = {f"tweet-summary-{i}" for i in range(4)}
    served = set()
    for _ in range(20):
        response = gateway.post("/v1/completions", json=completion("tweet-summary", max_tokens=1))
        assert response.status_code == 200, response.text
        served.add(response.json()["model"])  # the pod echoes the model it was asked for
    assert served <= targets
    assert served  # at least one draw; the weights make several likely, so no assertion on the spread


def test_a_model_that_is_its_own_target_is_forwarded_unchanged(gateway: httpx.Client, pool: Pool) -> None:
    # A rewritten body is re-encoded; this one must reach the pod byte for byte, key order included.
    body = b'{"prompt": "keep my spacing", "max_tokens": 1,   "model": "sql-lora"}'
    response = gateway.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "sql-lora"


def test_requests_for_an_adapter_go_to_the_pod_that_has_it(
    gateway: httpx.Client, stack: Stack, pool: Pool
) -> None:
    home = pool.addresses[1]
    pool.pin(home, runningAdapters=["pinned-lora"], maxLora=4)
    pool.wait_for(lambda pods: "pinned-lora" in pods[home]["activeAdapters"])
    landed = [_served_by(gateway, "pinned-lora") for _ in range(20)]
    assert landed == [home] * 20


def test_an_adapter_keeps_going_where_its_first_request_went(gateway: httpx.Client, pool: Pool) -> None:
    assert not any("organic-lora" in p["activeAdapters"] for p in pool.pods().values())
    # Long enough (tens of steps) that the collector sees the adapter running on its pod.
    first = gateway.post("/v1/completions", json=completion("organic-lora", max_tokens=64))
    assert first.status_code == 200, first.text
    home = first.headers[POD_HEADER]
    pool.wait_for(lambda pods: "organic-lora" in pods[home]["activeAdapters"])
    landed = [_served_by(gateway, "organic-lora") for _ in range(15)]
    assert landed == [home] * 15


def _served_by(gateway: httpx.Client, model: str) -> str:
    response = gateway.post("/v1/completions", json=completion(model, max_tokens=1))
    assert response.status_code == 200, response.text
    return response.headers[POD_HEADER]


def test_every_pod_advertises_its_adapter_slots(stack: Stack, pool: Pool) -> None:
    # Even a pod that has not served an adapter yet (only an idle lora_requests_info series) counts as
    # having free slots; else LoRA affinity would never pick it for a new adapter.
    pool.wait_for(lambda pods: all(p["maxLora"] == stack.sim.max_loras for p in pods.values()))


def test_v1_models_lists_the_names_clients_send(gateway: httpx.Client) -> None:
    response = gateway.get("/v1/models")
    assert response.status_code == 200, response.text
    assert POD_HEADER not in response.headers  # the picker answered, from its config
    listed = [model["id"] for model in response.json()["data"]]
    config = yaml.safe_load((Path(__file__).parent / "pointsman-test.yaml").read_text(encoding="utf-8"))
    assert listed == [model["modelName"] for model in config["models"]]
    assert "tweet-summary-0" not in listed  # a target: what the picker sends pods, not what clients send
