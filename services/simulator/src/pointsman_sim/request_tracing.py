"""The simulator's span, as vLLM's (``--otlp-traces-endpoint``): ``llm_request`` per finished request,
parented on the request's ``traceparent``, from its arrival to its end, with vLLM's ``gen_ai.*``
attribute names for the queue, prefill and decode times and the token counts, and the adapter load
time vLLM does not record.

The engine's times are simulated seconds: divided by the pod's speedup they are wall seconds, like
the span's own start and end.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from opentelemetry.trace import SpanKind, Tracer

from pointsman_shared.tracing import extract
from pointsman_sim.engine import FinishedRequest

SPAN_NAME = "llm_request"


class RequestTracer:
    def __init__(self, tracer: Tracer, *, pod: str, speedup: float = 1.0) -> None:
        self._tracer = tracer
        self._pod = pod
        self._speedup = speedup

    def finished(
        self,
        headers: Mapping[str, str],
        arrived_ns: int,
        model: str,
        max_tokens: int,
        result: FinishedRequest,
    ) -> None:
        """Record the span of a request that arrived at ``arrived_ns`` (wall clock) and ended now."""
        scale = 1.0 / self._speedup
        scheduled = result.scheduled_at if result.scheduled_at is not None else result.arrived_at
        span = self._tracer.start_span(
            SPAN_NAME, context=extract(headers), kind=SpanKind.SERVER, start_time=arrived_ns
        )
        if span.is_recording():
            span.set_attributes(
                {
                    "gen_ai.request.id": result.request_id,
                    "gen_ai.response.model": model,
                    "gen_ai.request.max_tokens": max_tokens,
                    "gen_ai.usage.prompt_tokens": result.prompt_tokens,
                    "gen_ai.usage.completion_tokens": result.output_tokens,
                    "gen_ai.latency.time_in_queue": result.time_in_queue * scale,
                    "gen_ai.latency.time_to_first_token": result.time_to_first_token * scale,
                    "gen_ai.latency.e2e": result.e2e_latency * scale,
                    "gen_ai.latency.time_in_model_prefill": (result.first_token_at - scheduled) * scale,
                    "gen_ai.latency.time_in_model_decode": (result.finished_at - result.first_token_at)
                    * scale,
                    "pointsman_sim.pod": self._pod,
                    "pointsman_sim.adapter": result.adapter or "",
                    "pointsman_sim.adapter_load_s": result.adapter_load * scale,
                }
            )
        span.end(end_time=time.time_ns())
