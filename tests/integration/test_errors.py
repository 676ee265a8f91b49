"""What the picker answers instead of a pod: errors and load shedding, as Envoy passes them on."""

from __future__ import annotations

import httpx
import pytest
from integration_kit import POD_HEADER, Pool, completion

from pointsman_devstack.stack import Stack

pytestmark = pytest.mark.integration


def test_an_unknown_model_passes_through_to_a_pod_that_answers_404(gateway: httpx.Client) -> None:
    # Upstream v1: a model no InferenceModel names is served as asked (picker.passthroughUnknownModels).
    response = gateway.post("/v1/completions", json=completion("no-such-model"))
    assert response.status_code == 404
    assert POD_HEADER in response.headers  # routed: the pod does not serve that model


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"{not json", id="not-json"),
        pytest.param(b'{"prompt": "no model"}', id="no-model"),
        pytest.param(b'{"model": 7}', id="model-not-a-string"),
    ],
)
def test_a_body_without_a_model_name_gets_400(gateway: httpx.Client, body: bytes) -> None:
    response = gateway.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert POD_HEADER not in response.headers


def test_sheddable_requests_get_429_when_every_pod_is_saturated(
    gateway: httpx.Client, stack: Stack, pool: Pool
) -> None:
    _saturate(pool)
    shed = gateway.post("/v1/completions", json=completion("sql-lora-sheddable"))
    assert shed.status_code == 429
    assert POD_HEADER not in shed.headers
    # Critical traffic for the very same adapter is still served.
    kept = gateway.post("/v1/completions", json=completion("sql-lora"))
    assert kept.status_code == 200, kept.text
    assert kept.headers[POD_HEADER] in stack.pod_addresses


def test_sheddable_requests_go_to_the_pod_that_has_capacity(gateway: httpx.Client, pool: Pool) -> None:
    _saturate(pool, spare=pool.addresses[2])
    landed = {_served_by(gateway, "sql-lora-sheddable") for _ in range(10)}
    assert landed == {pool.addresses[2]}


def _saturate(pool: Pool, spare: str | None = None) -> None:
    """Every pod but ``spare`` reports a queue and a KV cache past the sheddable thresholds (5, 0.8)."""
    busy = [a for a in pool.addresses if a != spare]
    for address in busy:
        pool.pin(address, waiting=10, kvCacheUsage=0.9)
    pool.wait_for(lambda pods: all(pods[a]["waiting"] == 10 and pods[a]["kvCacheUsage"] >= 0.9 for a in busy))


def _served_by(gateway: httpx.Client, model: str) -> str:
    response = gateway.post("/v1/completions", json=completion(model, max_tokens=1))
    assert response.status_code == 200, response.text
    return response.headers[POD_HEADER]
