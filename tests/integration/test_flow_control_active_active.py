"""Two pickers with flow control behind one Envoy, sharing Redis, in front of a saturated pool (slow
pods, one request at a time each): every request is answered once, both pickers hold requests and
dispatch them, the pods serve each exactly once, the pickers share their dispatches through Redis,
and the explain header says how long a held request waited and why (docs/flow-control.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
import yaml
from integration_kit import TEST_CONFIG, completion, stack_environ
from prometheus_client.parser import text_string_to_metric_families

from pointsman_devstack.stack import SimOptions, Stack, StackOptions, StackPorts
from pointsman_shared.config import load_config
from pointsman_shared.keys import RedisKeys

pytestmark = pytest.mark.integration

REQUESTS = 60
EXPLAIN = "x-pointsman-explain"
DURATION = "inference_extension_flow_control_request_queue_duration_seconds_count"


@pytest.fixture(scope="module")
def saturated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir = Path(tmp_path_factory.mktemp("flow-two-pickers"))
    doc = yaml.safe_load(TEST_CONFIG.read_text(encoding="utf-8"))
    # A pod with one request waiting is full: with one sequence a pod, most requests wait.
    doc["flowControl"] = {
        "enabled": True,
        "defaultRequestTTL": "20s",
        "saturationDetector": {"queueDepthThreshold": 1},
    }
    config_path = run_dir / "flow.yaml"
    config_path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    config = load_config(config_path, environ={})
    options = StackOptions(
        config_path=config_path,
        run_dir=run_dir,
        ports=StackPorts.free(len(config.pool.endpoints), picker_replicas=2),
        sim=SimOptions.for_config(config, max_num_seqs=1, speedup=2.0),
        environ=stack_environ(),
    )
    with Stack(options) as running:
        yield running


def _counts(text: str, name: str, **labels: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


async def _send(stack: Stack) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=30.0) as client:
        return await asyncio.gather(
            *(
                client.post(
                    "/v1/completions", json=completion("sql-lora", max_tokens=4), headers={EXPLAIN: "1"}
                )
                for _ in range(REQUESTS)
            )
        )


def test_a_saturated_pool_behind_two_pickers_answers_every_request_once(saturated: Stack) -> None:
    stack = saturated
    pickers = [metrics for _, _, metrics in stack.ports.pickers]
    keys = RedisKeys(load_config(stack.options.config_path, environ={}).pool.name)
    with httpx.Client(timeout=10.0) as http:
        served_before = sum(
            _counts(http.get(f"http://{pod}/metrics").text, "vllm:request_success_total")
            for pod in stack.pod_addresses
        )
        responses = asyncio.run(_send(stack))
        assert [r.status_code for r in responses] == [200] * REQUESTS, [r.text for r in responses][:3]
        # The pods served each request once: no request routed twice, none lost on the way.
        served = sum(
            _counts(http.get(f"http://{pod}/metrics").text, "vllm:request_success_total")
            for pod in stack.pod_addresses
        )
        assert served - served_before == REQUESTS
        pages = [http.get(f"http://127.0.0.1:{port}/metrics").text for port in pickers]
    # Both pickers held requests and dispatched every one they held; none expired or was dropped.
    dispatched = [_counts(page, DURATION, outcome="Dispatched") for page in pages]
    assert all(dispatched), dispatched
    assert [_counts(page, DURATION) for page in pages] == dispatched
    assert [_counts(page, "inference_extension_flow_control_queue_size") for page in pages] == [0, 0]
    # Each picker has its report of dispatches in Redis.
    client = redis.Redis.from_url(stack.redis_url)
    try:
        assert client.hlen(keys.dispatches) == 2
    finally:
        client.close()
    held = [r.headers[EXPLAIN] for r in responses if "in flow control" in r.headers.get(EXPLAIN, "")]
    assert len(held) == sum(dispatched)
    assert all(h.startswith("waited ") and "): " in h for h in held), held[:3]
