"""The picker's span: ``pointsman.picker.route``, one per routed (or refused) request.

Its parent is the trace context Envoy sends: the ext_proc call's gRPC metadata first (Envoy's span for
the call, a child of its request span), else the request's own ``traceparent`` header (a client's
context, when Envoy does not trace). The tracer provider's sampler decides: with the default
``parentbased_traceidratio`` a request with a context follows its sampled flag, one without is sampled
at ``tracing.ratio``. An unsampled request costs a sampling decision and no span.

Attributes (docs/tracing.md): the model asked for and the target, the objective and its priority, the
profile, the path the decision took (the explain text), the pods considered, the pod picked or why the
request was refused, the snapshot's age and the result; ``pointsman.queue_time_s`` when flow control
held the request (:meth:`RouteSpan.queued`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from pointsman_picker.errors import NoCapacity, PickerError
from pointsman_picker.routing import Routing
from pointsman_shared.tracing import extract, trace_headers

SPAN_NAME = "pointsman.picker.route"


class RouteSpan:
    """One request's span, from the moment its body is complete to the decision."""

    __slots__ = ("_span", "_tracer")

    def __init__(self, span: Span, tracer: RouteTracer) -> None:
        self._span = span
        self._tracer = tracer

    def queued(self, seconds: float) -> None:
        """Flow control held the request this long before it was scheduled (its hook)."""
        self._span.set_attribute("pointsman.queue_time_s", seconds)

    def routed(self, routing: Routing) -> None:
        span = self._span
        span.set_attributes(
            {
                "gen_ai.request.model": routing.model,
                "pointsman.target_model": routing.target,
                "pointsman.priority": routing.priority,
                "pointsman.profile": self._tracer.profile(),
                "pointsman.explain": routing.explain,
                "pointsman.pods": routing.pods,
                "pointsman.endpoint": routing.endpoint,
                "pointsman.result": routing.result,
            }
        )
        self._end()

    def failed(self, error: PickerError) -> None:
        span = self._span
        attributes: dict[str, str | int] = {
            "pointsman.profile": self._tracer.profile(),
            "pointsman.result": error.result,
            "http.response.status_code": error.status,
        }
        if error.model:
            attributes["gen_ai.request.model"] = error.model
            attributes["pointsman.target_model"] = error.target
        if error.explain:
            attributes["pointsman.explain"] = error.explain
        if isinstance(error, NoCapacity):
            attributes["pointsman.drop_reason"] = error.message
        span.set_attributes(attributes)
        if error.status >= 500:
            span.set_status(Status(StatusCode.ERROR, error.message))
        self._end()

    def _end(self) -> None:
        age = self._tracer.snapshot_age()
        if age is not None:
            self._span.set_attribute("pointsman.snapshot_age_s", round(age, 6))
        self._span.end()


class RouteTracer:
    """Starts a :class:`RouteSpan` for the requests the sampler keeps."""

    def __init__(
        self,
        tracer: Tracer,
        *,
        profile: Callable[[], str],
        snapshot_age: Callable[[], float | None],
        objective_header: Callable[[], str],
    ) -> None:
        self._tracer = tracer
        self.profile = profile
        self.snapshot_age = snapshot_age
        self._objective_header = objective_header

    def start(
        self, request_id: str, headers: Mapping[str, str], metadata: Iterable[tuple[bytes | str, bytes | str]]
    ) -> RouteSpan | None:
        """The request's span, or ``None`` when the sampler leaves it out."""
        parent = extract(trace_headers(metadata), headers)
        span = self._tracer.start_span(SPAN_NAME, context=parent, kind=SpanKind.SERVER)
        if not span.is_recording():
            return None
        span.set_attribute("pointsman.request_id", request_id)
        objective = headers.get(self._objective_header())
        if objective is not None:
            span.set_attribute("pointsman.objective", objective[:128])
        return RouteSpan(span, self)
