"""One pod's HTTP API: vLLM's OpenAI-compatible routes, ``/metrics``, ``/health`` and ``/control``.

Routes:
- ``POST /v1/completions``, ``POST /v1/chat/completions``: ``model`` is the base model or an adapter
  (else 404); JSON responses always carry ``usage``; ``"stream": true`` answers with SSE ``data:``
  chunks, a usage chunk when ``stream_options.include_usage`` is true, then ``data: [DONE]``.
- ``GET /v1/models``: the base model, then each adapter with ``parent`` = the base model.
- ``GET /metrics``: vLLM's Prometheus page (pins applied); ``GET /health``: 200 while serving.
- ``POST /v1/load_lora_adapter`` ``{"lora_name": ..., "lora_path": ...}`` serves one more adapter (400
  if already served); ``POST /v1/unload_lora_adapter`` ``{"lora_name": ...}`` stops serving one (404 if
  unknown); both answer with vLLM's plain-text success line.
- ``POST /control``: ``{"pin": {"waiting": 12, "running": 3, "kvCacheUsage": 0.5,
  "runningAdapters": ["a"], "waitingAdapters": [], "maxLora": 4}}`` (any subset of the keys) replaces
  the pins, ``{"pin": null}`` clears them; ``{"fault": {...}}`` likewise for injected faults
  (:mod:`pointsman_sim.control` lists them); answers ``{"pin": <pins> | null, "fault": <faults> |
  null}``. Errors: 400. Faults never apply to ``/control`` itself. ``GET /control`` answers the same
  and ``"totals"``: the engine's counters (tokens, requests, preemptions, adapter loads and evictions).

Every response, errors included, carries ``x-pointsman-pod: <pod name>`` so tests can tell which pod
served a request. Errors have vLLM's shape ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pointsman_sim.control import ControlError, parse_control
from pointsman_sim.driver import PodClosed, RequestStream
from pointsman_sim.engine import RequestRejected
from pointsman_sim.metrics import CONTENT_TYPE
from pointsman_sim.openai_protocol import (
    ChatCompletion,
    GenerationCall,
    InvalidRequest,
    TextCompletion,
    error_body,
    filler_text,
    parse_chat,
    parse_completion,
    usage,
)
from pointsman_sim.pod import ModelNotServed, SimPod
from pointsman_sim.request_tracing import RequestTracer

logger = logging.getLogger(__name__)

POD_HEADER = "x-pointsman-pod"


class ResponseShape(Protocol):
    def opening_chunks(self) -> list[dict[str, object]]: ...
    def chunk(self, text: str, finish_reason: str | None) -> dict[str, object]: ...
    def body(self, text: str, finish_reason: str, usage: dict[str, object]) -> dict[str, object]: ...
    def usage_chunk(self, usage: dict[str, object]) -> dict[str, object]: ...


def create_app(pod: SimPod, *, tracer: RequestTracer | None = None) -> FastAPI:
    """The pod's app; the pod must be running (``async with pod``) for generation requests. With a
    ``tracer``, each finished generation request records its span."""
    app = FastAPI(title="pointsman-sim", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(PodHeaderMiddleware, pod_name=pod.name)
    app.add_middleware(DropConnectionsMiddleware, pod=pod)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _generate(pod, request, parse_completion, TextCompletion, "cmpl", tracer)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _generate(pod, request, parse_chat, ChatCompletion, "chatcmpl", tracer)

    @app.get("/v1/models")
    async def models() -> Response:
        def card(model_id: str, parent: str | None) -> dict[str, object]:
            return {
                "id": model_id,
                "object": "model",
                "created": pod.started_at,
                "owned_by": "vllm",
                "root": model_id,
                "parent": parent,
                "max_model_len": pod.spec.engine.max_model_len if parent is None else None,
            }

        cards = [card(pod.spec.model, None), *(card(a, pod.spec.model) for a in pod.adapters)]
        return _json({"object": "list", "data": cards})

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        name = _lora_name(await request.body())
        if name is None:
            return _error(400, "BadRequestError", "lora_name is required", "lora_name")
        try:
            pod.load_adapter(name)
        except ValueError as exc:
            return _error(400, "BadRequestError", str(exc), "lora_name")
        return Response(f"Success: LoRA adapter '{name}' added successfully.", media_type="text/plain")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        name = _lora_name(await request.body())
        if name is None:
            return _error(400, "BadRequestError", "lora_name is required", "lora_name")
        try:
            pod.unload_adapter(name)
        except ModelNotServed:
            return _error(404, "NotFoundError", f"The lora adapter '{name}' cannot be found.", "lora_name")
        return Response(f"Success: LoRA adapter '{name}' removed successfully.", media_type="text/plain")

    @app.get("/metrics")
    async def metrics() -> Response:
        faults = pod.faults
        if faults is None:
            return Response(pod.metrics_page(), media_type=CONTENT_TYPE)
        if faults.metrics_delay_ms:
            await asyncio.sleep(faults.metrics_delay_ms / 1000)
        if faults.metrics_status is not None:
            return _error(faults.metrics_status, "InternalServerError", "injected fault: /metrics fails")
        page = pod.metrics_page()
        if faults.metrics_malformed:
            page = malformed(page)
        return Response(page, media_type=CONTENT_TYPE)

    @app.get("/health")
    async def health() -> Response:
        return Response()

    @app.post("/control")
    async def control(request: Request) -> Response:
        try:
            change = parse_control(orjson.loads(await request.body()))
        except orjson.JSONDecodeError as exc:
            return _error(400, "BadRequestError", f"the body is not JSON: {exc}")
        except ControlError as exc:
            return _error(400, "BadRequestError", str(exc), "pin")
        if change.sets_pins:
            pod.pins = change.pins
        if change.sets_faults:
            pod.set_faults(change.faults)
        return _json(_control_state(pod))

    @app.get("/control")
    async def control_state() -> Response:
        return _json({**_control_state(pod), "totals": dataclasses.asdict(pod.engine.totals())})

    return app


async def _generate(
    pod: SimPod,
    request: Request,
    parse: Callable[[object], GenerationCall],
    shape_type: Callable[[str, str, int], ResponseShape],
    id_prefix: str,
    tracer: RequestTracer | None = None,
) -> Response:
    arrived_ns = time.time_ns()
    try:
        call = parse(orjson.loads(await request.body()))
    except orjson.JSONDecodeError as exc:
        return _error(400, "BadRequestError", f"the body is not JSON: {exc}")
    except InvalidRequest as exc:
        return _error(400, "BadRequestError", str(exc), exc.param)
    if pod.faults is not None and pod.faults.inference_status is not None:
        return _error(pod.faults.inference_status, "InternalServerError", "injected fault: inference fails")
    request_id = f"{id_prefix}-{uuid.uuid4().hex}"
    try:
        stream = pod.submit(request_id, call.model, call.prompt, call.max_tokens)
    except ModelNotServed:
        return _error(404, "NotFoundError", f"The model `{call.model}` does not exist.", "model")
    except RequestRejected as exc:
        return _error(400, "BadRequestError", str(exc))
    except PodClosed as exc:
        return _error(503, "ServiceUnavailableError", str(exc))
    shape = shape_type(request_id, call.model, int(time.time()))

    def traced() -> None:  # once the request finished: its span
        if tracer is not None and stream.result is not None:
            tracer.finished(request.headers, arrived_ns, call.model, call.max_tokens, stream.result)

    if call.stream:
        return StreamingResponse(_events(pod, call, shape, stream, traced), media_type="text/event-stream")
    try:
        produced = await _until_done_or_gone(stream, request)
    except PodClosed as exc:
        return _error(503, "ServiceUnavailableError", str(exc))
    finally:
        if not stream.done:
            pod.cancel(request_id)
    if produced is None:
        return Response(status_code=499)  # nobody is listening; vLLM aborts such requests too
    traced()
    return _json(shape.body(filler_text(0, produced), "length", usage(call.prompt_tokens, produced)))


async def _until_done_or_gone(stream: RequestStream, request: Request) -> int | None:
    """The number of tokens generated, or ``None`` if the client disconnected first."""

    async def count() -> int:
        return sum([n async for n in stream.tokens()])

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    counting = asyncio.ensure_future(count())
    watching = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait((counting, watching), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
        counting.cancel()
    return counting.result() if counting.done() and not counting.cancelled() else None


async def _events(
    pod: SimPod,
    call: GenerationCall,
    shape: ResponseShape,
    stream: RequestStream,
    on_finished: Callable[[], None],
) -> AsyncIterator[bytes]:
    """The SSE body; a client that goes away cancels this generator, which frees the engine."""
    try:
        for chunk in shape.opening_chunks():
            yield _event(chunk)
        produced = 0
        async for count in stream.tokens():
            text = filler_text(produced, count)
            produced += count
            yield _event(shape.chunk(text, "length" if produced >= call.max_tokens else None))
        on_finished()
        if call.include_usage:
            yield _event(shape.usage_chunk(usage(call.prompt_tokens, produced)))
    except PodClosed as exc:
        yield _event(error_body(str(exc), "ServiceUnavailableError", 503))
    finally:
        if not stream.done:
            pod.cancel(stream.request_id)
    yield b"data: [DONE]\n\n"


def _event(payload: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _json(payload: dict[str, object], status_code: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status_code, media_type="application/json")


def _error(status_code: int, error_type: str, message: str, param: str | None = None) -> Response:
    return _json(error_body(message, error_type, status_code, param), status_code)


def _control_state(pod: SimPod) -> dict[str, object]:
    return {
        "pin": None if pod.pins is None else pod.pins.to_json(),
        "fault": None if pod.faults is None else pod.faults.to_json(),
    }


def _lora_name(body: bytes) -> str | None:
    try:
        fields = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    name = fields.get("lora_name") if isinstance(fields, dict) else None
    return name if isinstance(name, str) else None


def malformed(page: str) -> str:
    """The page with a sample line no Prometheus parser accepts, and cut off mid-line."""
    broken = page.replace("vllm:num_requests_running{", 'vllm:num_requests_running{engine="0" garbage,', 1)
    return broken[: len(broken) * 2 // 3]


class DropConnectionsMiddleware:
    """With the ``dropConnections`` fault, cut every response but ``/control``'s off after its headers.

    Returning without finishing the body makes the server close the connection, so the client sees
    the connection drop mid-response.
    """

    def __init__(self, app: ASGIApp, pod: SimPod) -> None:
        self._app = app
        self._pod = pod

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        faults = self._pod.faults
        if (
            scope["type"] != "http"
            or faults is None
            or not faults.drop_connections
            or scope["path"] == "/control"
        ):
            await self._app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1000")]})


class PodHeaderMiddleware:
    """Adds the pod header to every response, including the 500 it makes of an unhandled error.

    It wraps the routes (inside FastAPI's own error middleware), so it answers unexpected errors
    itself; otherwise those 500s would go out without the header.
    """

    def __init__(self, app: ASGIApp, pod_name: str) -> None:
        self._app = app
        self._header = (POD_HEADER.encode(), pod_name.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = False

        async def send_with_header(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message = {**message, "headers": [*message.get("headers", ()), self._header]}
            await send(message)

        try:
            await self._app(scope, receive, send_with_header)
        except Exception:
            if started:
                raise
            logger.exception("unhandled error serving %s %s", scope["method"], scope["path"])
            response = _error(500, "InternalServerError", "internal error in the simulator")
            await response(scope, receive, send_with_header)
