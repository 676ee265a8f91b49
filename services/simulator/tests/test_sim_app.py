from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson
import pytest

from pointsman_shared.model_server import PRESETS, LoraState, MetricsPageError, read_page
from pointsman_sim.app import POD_HEADER, create_app
from pointsman_sim.engine import EngineConfig
from pointsman_sim.pod import DEFAULT_MODEL, PodSpec, SimPod
from pointsman_sim.servers import bind, pod_server

ADAPTERS = ("tweet-summary-0", "sql-lora")
FAST = 1000.0  # a 7 ms step takes 7 µs


def spec(name: str = "pod-1", speedup: float = FAST) -> PodSpec:
    return PodSpec(name=name, adapters=ADAPTERS, engine=EngineConfig(max_loras=1), speedup=speedup)


@pytest.fixture
async def pod() -> AsyncIterator[SimPod]:
    async with SimPod(spec()) as running:
        yield running


@pytest.fixture
async def client(pod: SimPod) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(pod))
    async with httpx.AsyncClient(transport=transport, base_url="http://pod") as c:
        yield c


def completion(model: str = DEFAULT_MODEL, **extra: object) -> dict[str, object]:
    return {"model": model, "prompt": "x" * 40, **extra}


def chat(model: str = DEFAULT_MODEL, **extra: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "y" * 40}], **extra}


def sse_payloads(text: str) -> list[Any]:
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    return [orjson.loads(e) for e in events[:-1]]


@pytest.mark.parametrize(
    ("path", "body", "object_name"),
    [
        pytest.param("/v1/completions", completion(max_tokens=5), "text_completion", id="completion-base"),
        pytest.param(
            "/v1/completions",
            completion("sql-lora", max_tokens=5),
            "text_completion",
            id="completion-adapter",
        ),
        pytest.param("/v1/chat/completions", chat(max_tokens=5), "chat.completion", id="chat"),
        pytest.param(
            "/v1/chat/completions", chat(max_completion_tokens=5), "chat.completion", id="chat-max-completion"
        ),
    ],
)
async def test_json_response_has_usage(
    client: httpx.AsyncClient, path: str, body: dict[str, object], object_name: str
) -> None:
    response = await client.post(path, json=body)
    assert response.status_code == 200
    payload = response.json()
    assert payload["object"] == object_name
    assert payload["model"] == body["model"]
    assert payload["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    choice = payload["choices"][0]
    text = choice["text"] if "text" in choice else choice["message"]["content"]
    assert len(text.split()) == 5
    assert choice["finish_reason"] == "length"


async def test_max_tokens_defaults_to_16(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/completions", json=completion())
    assert response.json()["usage"]["completion_tokens"] == 16


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param("/v1/completions", completion, id="completion"),
        pytest.param("/v1/chat/completions", chat, id="chat"),
    ],
)
@pytest.mark.parametrize("include_usage", [True, False])
async def test_stream_sends_chunks_then_done(
    client: httpx.AsyncClient, path: str, body: Callable[..., dict[str, object]], include_usage: bool
) -> None:
    request = body(max_tokens=3, stream=True, stream_options={"include_usage": include_usage})
    response = await client.post(path, json=request)
    assert response.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(response.text)
    usage = [p for p in payloads if not p["choices"]]
    tokens = [p["choices"][0] for p in payloads if p["choices"] and _text(p["choices"][0])]
    assert len(tokens) == 3
    assert [c["finish_reason"] for c in tokens] == [None, None, "length"]
    expected = [{"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}] if include_usage else []
    assert [u["usage"] for u in usage] == expected


def _text(choice: dict[str, Any]) -> str:
    return str(choice["text"] if "text" in choice else choice["delta"].get("content") or "")


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        pytest.param("GET", "/health", None, 200, id="health"),
        pytest.param("GET", "/metrics", None, 200, id="metrics"),
        pytest.param("GET", "/v1/models", None, 200, id="models"),
        pytest.param("POST", "/v1/completions", completion(max_tokens=1), 200, id="completion"),
        pytest.param("POST", "/v1/completions", completion("nope"), 404, id="unknown-model"),
        pytest.param("POST", "/v1/completions", {"model": 3}, 400, id="bad-request"),
        pytest.param("POST", "/control", {"pin": None}, 200, id="control"),
        pytest.param("GET", "/no/such/route", None, 404, id="no-route"),
    ],
)
async def test_every_response_names_the_pod(
    client: httpx.AsyncClient, method: str, path: str, body: object, status: int
) -> None:
    response = await client.request(method, path, json=body)
    assert response.status_code == status
    assert response.headers[POD_HEADER] == "pod-1"


async def test_unexpected_error_is_a_500_with_the_pod_header(
    client: httpx.AsyncClient, pod: SimPod, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> str:
        raise RuntimeError("boom")

    monkeypatch.setattr(pod, "metrics_page", broken)
    response = await client.get("/metrics")
    assert response.status_code == 500
    assert response.headers[POD_HEADER] == "pod-1"
    assert response.json()["error"]["code"] == 500


@pytest.mark.parametrize(
    ("path", "body", "status", "error_type"),
    [
        pytest.param("/v1/completions", completion("nope"), 404, "NotFoundError", id="unknown-model"),
        pytest.param("/v1/chat/completions", chat("nope"), 404, "NotFoundError", id="unknown-model-chat"),
        pytest.param("/v1/completions", completion(max_tokens=0), 400, "BadRequestError", id="max-tokens-0"),
        pytest.param("/v1/completions", {"model": DEFAULT_MODEL}, 400, "BadRequestError", id="no-prompt"),
        pytest.param(
            "/v1/chat/completions", {"model": DEFAULT_MODEL}, 400, "BadRequestError", id="no-messages"
        ),
        pytest.param(
            "/v1/completions", completion(max_tokens=200_000), 400, "BadRequestError", id="exceeds-context"
        ),
    ],
)
async def test_errors_have_the_openai_shape(
    client: httpx.AsyncClient, path: str, body: object, status: int, error_type: str
) -> None:
    response = await client.post(path, json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert (error["type"], error["code"]) == (error_type, status)
    assert error["message"]


async def test_models_lists_base_then_adapters(client: httpx.AsyncClient) -> None:
    cards = (await client.get("/v1/models")).json()["data"]
    assert [(c["id"], c["parent"]) for c in cards] == [
        (DEFAULT_MODEL, None),
        ("tweet-summary-0", DEFAULT_MODEL),
        ("sql-lora", DEFAULT_MODEL),
    ]


async def test_pins_fix_the_metrics_page_until_cleared(client: httpx.AsyncClient) -> None:
    pin = {"waiting": 12, "running": 3, "kvCacheUsage": 0.5, "runningAdapters": ["sql-lora"], "maxLora": 2}
    response = await client.post("/control", json={"pin": pin})
    assert response.json() == {"pin": pin, "fault": None}
    pinned = read_page((await client.get("/metrics")).text, PRESETS["vllm"])
    assert (pinned.waiting, pinned.running, pinned.kv_cache_usage) == (12, 3, 0.5)
    assert pinned.lora == LoraState(2, frozenset({"sql-lora"}), frozenset())

    assert (await client.post("/control", json={"pin": None})).json() == {"pin": None, "fault": None}
    live = read_page((await client.get("/metrics")).text, PRESETS["vllm"])
    assert (live.waiting, live.running, live.kv_cache_usage) == (0, 0, 0.0)
    # Idle now: the newest series has both adapter labels empty, so the reader keeps the last busy one.
    assert live.lora == LoraState(2, frozenset({"sql-lora"}), frozenset())


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"{", id="not-json"),
        pytest.param(b'{"pin": {"waiting": -1}}', id="invalid-pin"),
    ],
)
async def test_control_rejects_bad_bodies(client: httpx.AsyncClient, body: bytes) -> None:
    response = await client.post("/control", content=body)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "BadRequestError"


async def test_metrics_page_shows_a_running_adapter_request() -> None:
    async with SimPod(spec(speedup=1.0)) as pod:
        transport = httpx.ASGITransport(app=create_app(pod))
        async with httpx.AsyncClient(transport=transport, base_url="http://pod") as client:
            pending = asyncio.create_task(
                client.post("/v1/completions", json=completion("sql-lora", max_tokens=20))
            )
            await asyncio.sleep(0.03)
            busy = read_page((await client.get("/metrics")).text, PRESETS["vllm"])
            await pending
    assert (busy.running, busy.waiting) == (1, 0)
    assert busy.kv_cache_usage

    assert busy.lora == LoraState(1, frozenset({"sql-lora"}), frozenset())


# -- a real server on port 0 ----------------------------------------------------------------------


@pytest.fixture
async def served() -> AsyncIterator[tuple[SimPod, str]]:
    sock = bind("127.0.0.1", 0)
    address = f"127.0.0.1:{sock.getsockname()[1]}"
    async with SimPod(spec(name=address, speedup=10.0)) as pod:
        server = pod_server(pod)
        # The socket already listens: clients queue in its backlog until the server accepts.
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        yield pod, address
        server.should_exit = True
        await serving


async def test_real_server_streams_token_by_token(served: tuple[SimPod, str]) -> None:
    _, address = served
    async with httpx.AsyncClient(base_url=f"http://{address}") as client:
        request = completion(max_tokens=4, stream=True, stream_options={"include_usage": True})
        async with client.stream("POST", "/v1/completions", json=request) as response:
            assert response.headers[POD_HEADER] == address
            events = [line async for line in response.aiter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert len(events) == 6  # four tokens, usage, [DONE]


async def test_client_that_goes_away_frees_the_engine(served: tuple[SimPod, str]) -> None:
    pod, address = served
    async with httpx.AsyncClient(base_url=f"http://{address}") as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v1/completions", json=completion(max_tokens=100_000), timeout=0.2)
        async with client.stream(
            "POST", "/v1/completions", json=completion(max_tokens=100_000, stream=True)
        ) as r:
            async for _ in r.aiter_lines():
                break  # leaving the block closes the connection mid-stream
    for _ in range(100):
        if not pod.engine.has_work:
            break
        await asyncio.sleep(0.01)
    assert not pod.engine.has_work
    assert pod.engine.totals().aborted == 2


async def test_load_and_unload_lora_adapters(client: httpx.AsyncClient) -> None:
    loaded = await client.post("/v1/load_lora_adapter", json={"lora_name": "new-lora", "lora_path": "/x"})
    assert loaded.text == "Success: LoRA adapter 'new-lora' added successfully."
    again = await client.post("/v1/load_lora_adapter", json={"lora_name": "new-lora", "lora_path": "/x"})
    assert again.status_code == 400
    models = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
    assert models == [DEFAULT_MODEL, *ADAPTERS, "new-lora"]
    assert (
        await client.post("/v1/completions", json=completion("new-lora", max_tokens=2))
    ).status_code == 200

    removed = await client.post("/v1/unload_lora_adapter", json={"lora_name": "new-lora"})
    assert removed.text == "Success: LoRA adapter 'new-lora' removed successfully."
    assert (await client.post("/v1/unload_lora_adapter", json={"lora_name": "new-lora"})).status_code == 404
    assert (await client.post("/v1/completions", json=completion("new-lora"))).status_code == 404
    assert (await client.post("/v1/load_lora_adapter", json={})).status_code == 400


@pytest.mark.parametrize(
    ("fault", "check"),
    [
        pytest.param({"metricsStatus": 503}, lambda r: r.status_code == 503, id="metrics-status"),
        pytest.param({"metricsMalformed": True}, lambda r: not _parses(r.text), id="malformed"),
    ],
)
async def test_metrics_faults(
    client: httpx.AsyncClient, fault: dict[str, object], check: Callable[[httpx.Response], bool]
) -> None:
    assert (await client.post("/control", json={"fault": fault})).json() == {"pin": None, "fault": fault}
    assert check(await client.get("/metrics"))
    await client.post("/control", json={"fault": None})
    assert (await client.get("/metrics")).status_code == 200


def _parses(page: str) -> bool:
    try:
        read_page(page, PRESETS["vllm"])
    except MetricsPageError:
        return False
    return True


async def test_inference_fault_answers_with_its_status(client: httpx.AsyncClient) -> None:
    await client.post("/control", json={"fault": {"inferenceStatus": 500}})
    response = await client.post("/v1/completions", json=completion())
    assert response.status_code == 500
    assert response.json()["error"]["message"] == "injected fault: inference fails"


async def test_paused_pod_queues_requests_until_resumed(pod: SimPod, client: httpx.AsyncClient) -> None:
    await client.post("/control", json={"fault": {"paused": True}})
    pending = asyncio.create_task(client.post("/v1/completions", json=completion(max_tokens=3)))
    for _ in range(100):
        if pod.engine.waiting_count:
            break
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.05)
    assert (pod.engine.waiting_count, pending.done()) == (1, False)
    await client.post("/control", json={"fault": None})
    assert (await pending).status_code == 200


async def test_dropped_connections_and_slow_metrics(served: tuple[SimPod, str]) -> None:
    _, address = served
    async with httpx.AsyncClient(base_url=f"http://{address}") as client:
        await client.post("/control", json={"fault": {"dropConnections": True}})
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get("/metrics")
        await client.post("/control", json={"fault": {"metricsDelayMs": 300}})
        with pytest.raises(httpx.ReadTimeout):
            await client.get("/metrics", timeout=0.1)
        await client.post("/control", json={"fault": None})
        assert (await client.get("/metrics")).status_code == 200


async def test_control_state_shows_the_engine_counters(client: httpx.AsyncClient) -> None:
    for adapter in ("sql-lora", "tweet-summary-0", "sql-lora"):
        assert (
            await client.post("/v1/completions", json=completion(adapter, max_tokens=2))
        ).status_code == 200
    state = (await client.get("/control")).json()
    assert (state["pin"], state["fault"]) == (None, None)
    totals = state["totals"]
    # One slot and a CPU cache of one: every switch loads from disk and evicts the idle adapter.
    assert (totals["finished"], totals["lora_loads_from_disk"], totals["lora_evictions"]) == (3, 3, 2)


@pytest.mark.parametrize(
    ("first", "second", "hits"),
    [
        pytest.param(
            completion(prompt="s" * 400 + "a"), completion(prompt="s" * 400 + "b"), 96, id="shared-prefix"
        ),
        pytest.param(
            chat(messages=[{"role": "system", "content": "s" * 400}, {"role": "user", "content": "a"}]),
            chat(messages=[{"role": "system", "content": "s" * 400}, {"role": "user", "content": "b"}]),
            96,
            id="chat-system-prompt",
        ),
        pytest.param(
            completion(prompt=list(range(64))), completion(prompt=list(range(64))), 48, id="token-ids"
        ),
        pytest.param(
            completion(prompt="s" * 400), completion("sql-lora", prompt="s" * 400), 0, id="other-adapter"
        ),
    ],
)
async def test_prompts_that_share_a_prefix_hit_the_cache(
    client: httpx.AsyncClient, first: dict[str, object], second: dict[str, object], hits: int
) -> None:
    # 400 characters are 100 tokens: 6 full blocks; the same 64 ids are 4 blocks, of which 3 may hit.
    for body in (first, second):
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        assert (await client.post(path, json={**body, "max_tokens": 2})).status_code == 200
    totals = (await client.get("/control")).json()["totals"]
    assert totals["prefix_cache_hits"] == hits
    page = (await client.get("/metrics")).text
    assert f'vllm:prefix_cache_hits_total{{engine="0",model_name="{DEFAULT_MODEL}"}} {float(hits)}' in page
