"""The live bench's builtin client (``bench/live_client.py``) against a real simulator pod on port 0."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from pointsman_quality.live_stats import prefix_cache_totals
from pointsman_sim.engine import EngineConfig
from pointsman_sim.pod import PodSpec, SimPod
from pointsman_sim.prefix import Span, prompt_text
from pointsman_sim.servers import bind, pod_server

BENCH = Path(__file__).resolve().parents[3] / "bench"


@pytest.fixture
async def pod_url() -> AsyncIterator[str]:
    sock = bind("127.0.0.1", 0)
    address = f"127.0.0.1:{sock.getsockname()[1]}"
    spec = PodSpec(name=address, adapters=("hot-0",), engine=EngineConfig(max_loras=1), speedup=20.0)
    async with SimPod(spec) as pod:
        server = pod_server(pod)
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        yield f"http://{address}"
        server.should_exit = True
        await serving


async def test_builtin_client_measures_ttft_from_the_first_streamed_token_of_a_real_pod(pod_url: str) -> None:
    sys.path.insert(0, str(BENCH))
    try:
        from live_client import LiveRequest, replay  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(BENCH))
    requests = [
        LiveRequest(0.0, "hot-0", 40, 12),
        LiveRequest(0.05, "meta-llama/Llama-3.1-8B-Instruct", 8, 3),
    ]
    requests.append(LiveRequest(0.1, "no-such-adapter", 8, 3))
    results = await replay(pod_url, requests, request_timeout=10, run_timeout=20)
    first, second, missing = results
    assert first.ok
    assert second.ok
    assert (first.output_tokens, second.output_tokens) == (12, 3)
    assert first.ttft is not None
    assert first.tpot is not None
    # The first token waits for the adapter load and the prompt; the rest come a step apart, then the
    # usage event and [DONE] end the body.
    assert 0 < first.ttft < first.e2e
    assert first.tpot > 0
    assert first.ttft + 11 * first.tpot <= first.e2e < first.ttft + 11 * first.tpot + 0.05
    assert not missing.ok
    assert missing.error is not None
    assert missing.error.startswith("HTTP 404")


async def test_prompts_sent_as_their_spans_text_share_the_pods_prefix_cache(pod_url: str) -> None:
    sys.path.insert(0, str(BENCH))
    try:
        from live_client import LiveRequest, replay
    finally:
        sys.path.remove(str(BENCH))
    system, question = Span(1, 64), Span(2, 16)  # 4 full blocks of 16 tokens shared, then one of its own
    text = prompt_text((system, question), 80)
    other = prompt_text((system, Span(3, 16)), 80)
    base = "meta-llama/Llama-3.1-8B-Instruct"
    requests = [LiveRequest(0.0, base, 80, 2, text), LiveRequest(0.5, base, 80, 2, other)]
    async with httpx.AsyncClient() as client:
        before = prefix_cache_totals([(await client.get(f"{pod_url}/metrics")).text])
        results = await replay(pod_url, requests, request_timeout=10, run_timeout=20)
        after = prefix_cache_totals([(await client.get(f"{pod_url}/metrics")).text])
    assert all(r.ok for r in results)
    assert before is not None
    assert after is not None
    queries, hits = after[0] - before[0], after[1] - before[1]
    assert (queries, hits) == (160, 64)  # the second prompt's 4 system blocks, not its question's
