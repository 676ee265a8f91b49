"""Flow control's metrics, under upstream's names: how long requests waited and how they left
(``inference_extension_flow_control_request_queue_duration_seconds`` by priority, fairness id and
outcome), and from the queue at scrape time its size and bytes by priority and fairness id, and the
pool's saturation as the detector sees it."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pointsman_picker.director import BoundedLabels
from pointsman_picker.flowcontrol.controller import FlowController

# Fairness ids are client input: the first this many are their own label, later ones "other".
FLOW_LABELS = 64
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class FlowControlMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.flows = BoundedLabels(FLOW_LABELS)
        self.queue_duration = Histogram(
            "inference_extension_flow_control_request_queue_duration_seconds",
            "Time a request waited in flow control, by priority, fairness id and outcome.",
            ("priority", "fairness_id", "outcome"),
            buckets=QUEUE_BUCKETS,
            registry=registry,
        )

    def waited(self, priority: int, flow: str, outcome: str, seconds: float) -> None:
        self.queue_duration.labels(str(priority), self.flows.label(flow), outcome).observe(seconds)


class FlowCollector(Collector):
    """The queue as it is at scrape time (no stale series for a flow that stopped waiting)."""

    def __init__(self, controller: FlowController, flows: BoundedLabels, pool: str) -> None:
        self._controller = controller
        self._flows = flows
        self._pool = pool

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        size = GaugeMetricFamily(
            "inference_extension_flow_control_queue_size",
            "Requests waiting in flow control, by priority and fairness id.",
            labels=("inference_pool", "priority", "fairness_id"),
        )
        size_bytes = GaugeMetricFamily(
            "inference_extension_flow_control_queue_bytes",
            "Request body bytes waiting in flow control, by priority and fairness id.",
            labels=("inference_pool", "priority", "fairness_id"),
        )
        totals: dict[tuple[str, str], list[int]] = {}
        for priority, flow, requests, nbytes in self._controller.queue.sizes():
            counts = totals.setdefault((str(priority), self._flows.label(flow)), [0, 0])
            counts[0] += requests
            counts[1] += nbytes
        for (band, flow), (requests, nbytes) in totals.items():
            size.add_metric([self._pool, band, flow], requests)
            size_bytes.add_metric([self._pool, band, flow], nbytes)
        yield size
        yield size_bytes
        saturation = GaugeMetricFamily(
            "inference_extension_flow_control_pool_saturation",
            "How full the pool is for the saturation detector, 0 to 1.",
            labels=("inference_pool",),
        )
        saturation.add_metric([self._pool], self._controller.saturation())
        yield saturation
