"""The live bench's own load generator (``bench/live.py --client builtin``, and its fallback when
inference-perf cannot run): an open-loop replay of the scenario's trace over HTTP.

Request i is sent at ``start + trace[i].arrival`` whatever the earlier ones are doing (Poisson
arrivals when the scenario's are), as an OpenAI completion with ``stream: true``, the trace's model,
prompt length (:func:`pointsman_quality.prompts.prompt_text`: n tokens for the simulator; or, for a
trace whose prompts share prefixes, the text of its token spans, ``pointsman_sim.prefix.prompt_text``) and
``max_tokens``. TTFT is from the send to the first SSE event that carries text; TPOT from there to the
last one, over the tokens after the first (``usage.completion_tokens`` when the server sends it);
e2e to the end of the body. Everything is bounded: a timeout per request and one for the whole run.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from pointsman_quality.live_stats import RequestResult
from pointsman_quality.prompts import prompt_text
from pointsman_quality.sse import SseStream

PATH = "/v1/completions"


@dataclass(frozen=True, slots=True)
class LiveRequest:
    at: float  # seconds after the run's start
    model: str
    prompt_tokens: int
    max_tokens: int
    text: str | None = None  # the prompt itself (a trace whose prompts share prefixes); else made up


def body(request: LiveRequest, offset: int = 0) -> bytes:
    return json.dumps(
        {
            "model": request.model,
            "prompt": request.text
            if request.text is not None
            else prompt_text(request.prompt_tokens, offset),
            "max_tokens": request.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
    ).encode()


async def one(client: httpx.AsyncClient, url: str, request: LiveRequest, payload: bytes) -> RequestResult:
    start = time.perf_counter()
    first: float | None = None
    last: float | None = None
    stream = SseStream()
    try:
        async with client.stream(
            "POST", url, content=payload, headers={"content-type": "application/json"}
        ) as response:
            if response.status_code != 200:
                text = (await response.aread())[:200].decode(errors="replace")
                return RequestResult(
                    False,
                    start,
                    time.perf_counter(),
                    model=request.model,
                    error=f"HTTP {response.status_code} {text}",
                )
            async for chunk in response.aiter_raw():
                if stream.feed(chunk):
                    last = time.perf_counter()
                    if first is None:
                        first = last
    except (httpx.HTTPError, OSError) as exc:
        return RequestResult(False, start, time.perf_counter(), model=request.model, error=type(exc).__name__)
    end = time.perf_counter()
    tokens = stream.output_tokens
    if first is None or last is None or stream.error is not None:
        return RequestResult(
            False, start, end, model=request.model, error=stream.error or "no tokens streamed"
        )
    tpot = (last - first) / (tokens - 1) if tokens > 1 else None
    return RequestResult(True, start, end, first - start, tpot, tokens, request.model)


async def replay(
    base_url: str, requests: Sequence[LiveRequest], *, request_timeout: float, run_timeout: float
) -> list[RequestResult]:
    """Send every request at its time; results in the order of ``requests``. Requests still open
    after ``run_timeout`` seconds are cancelled and count as failed."""
    url = base_url.rstrip("/") + PATH
    payloads = [body(r, i) for i, r in enumerate(requests)]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    timeout = httpx.Timeout(request_timeout, connect=10.0)
    results: list[RequestResult | None] = [None] * len(requests)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        began = time.perf_counter() + 0.2

        async def due(i: int) -> None:
            await asyncio.sleep(max(0.0, began + requests[i].at - time.perf_counter()))
            results[i] = await one(client, url, requests[i], payloads[i])

        tasks = [asyncio.create_task(due(i)) for i in range(len(requests))]
        _, pending = await asyncio.wait(tasks, timeout=run_timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    now = time.perf_counter()
    return [
        result or RequestResult(False, now, now, model=r.model, error="cut off at the run's timeout")
        for result, r in zip(results, requests, strict=True)
    ]
