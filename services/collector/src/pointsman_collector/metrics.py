"""The collector's own Prometheus metrics, on a registry the caller owns (tests make a fresh one)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pointsman_collector.errors import PUBLISH_REASONS, SCRAPE_REASONS
from pointsman_shared.cluster import OBJECTIVE, REWRITE, WATCH_STATES, ClusterObjects
from pointsman_shared.snapshot import PoolSnapshot

# A scrape is ~1 ms on a LAN and bounded by the timeout (1 s by default); Redis publishes are faster.
_SCRAPE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_PUBLISH_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)


class CollectorMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        pool: str,
        snapshot: Callable[[], PoolSnapshot | None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        # prometheus_client's own: a plain recorder saved 0.5 µs a scrape, under the bench's noise
        # (docs/decisions/histogram.md).
        self.scrape_duration = Histogram(
            "pointsman_collector_scrape_duration_seconds",
            "Time to fetch and read one pod's metrics page, failed scrapes included.",
            buckets=_SCRAPE_BUCKETS,
            registry=registry,
        )
        self.scrape_errors = Counter(
            "pointsman_collector_scrape_errors",
            "Failed or partly failed scrapes, by reason.",
            ["reason"],
            registry=registry,
        )
        self.publish_duration = Histogram(
            "pointsman_collector_publish_duration_seconds",
            "Time to publish one pool snapshot to Redis, failed publishes included.",
            buckets=_PUBLISH_BUCKETS,
            registry=registry,
        )
        self.publish_errors = Counter(
            "pointsman_collector_publish_errors",
            "Failed publishes to Redis, by reason.",
            ["reason"],
            registry=registry,
        )
        self.snapshot_version = Gauge(
            "pointsman_collector_snapshot_version",
            "Version of the last pool snapshot published to Redis.",
            registry=registry,
        )
        # Zero series from the start, so rate() sees the first error of each kind.
        for reason in SCRAPE_REASONS:
            self.scrape_errors.labels(reason)
        for reason in PUBLISH_REASONS:
            self.publish_errors.labels(reason)
        registry.register(PoolCollector(pool, snapshot, clock))
        registry.register(LoopCollector())


class PoolCollector(Collector):
    """Per-pod gauges and upstream's pool gauges, read from the last published snapshot at scrape time.

    Built fresh on every collect, so a pod that left the pool leaves no stale series behind.
    """

    def __init__(
        self, pool: str, snapshot: Callable[[], PoolSnapshot | None], clock: Callable[[], float]
    ) -> None:
        self._pool = pool
        self._snapshot = snapshot
        self._clock = clock

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # the series depend on the pods; nothing to check at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self._snapshot()
        pods = snapshot.pods if snapshot is not None else ()
        labels = ["pool", "pod"]
        waiting = GaugeMetricFamily(
            "pointsman_pod_waiting_requests", "Requests waiting on the pod.", labels=labels
        )
        running = GaugeMetricFamily(
            "pointsman_pod_running_requests", "Requests running on the pod.", labels=labels
        )
        kv = GaugeMetricFamily(
            "pointsman_pod_kv_cache_usage", "KV-cache use of the pod, 0..1.", labels=labels
        )
        adapters = GaugeMetricFamily(
            "pointsman_pod_active_adapters", "LoRA adapters running or waiting on the pod.", labels=labels
        )
        healthy = GaugeMetricFamily(
            "pointsman_pod_healthy", "1 if the pod's data is current, else 0.", labels=labels
        )
        # Only pods that export prefix-cache metrics have a series: no rate is not a rate of 0.
        hit_rate = GaugeMetricFamily(
            "pointsman_pod_prefix_cache_hit_rate",
            "Prefix-cache hits over queries (tokens) of the pod over the collector's window, 0..1.",
            labels=labels,
        )
        for pod in pods:
            key = [self._pool, pod.address]
            waiting.add_metric(key, pod.waiting)
            running.add_metric(key, pod.running)
            kv.add_metric(key, pod.kv_cache_usage)
            adapters.add_metric(key, len(pod.active_adapters))
            healthy.add_metric(key, 1.0 if pod.healthy else 0.0)
            if pod.prefix_cache_hit_rate is not None:
                hit_rate.add_metric(key, pod.prefix_cache_hit_rate)
        yield from (waiting, running, kv, adapters, healthy, hit_rate)
        # How many pods are in each state, so a dashboard shows why pods are out without per-pod series.
        by_health = GaugeMetricFamily(
            "pointsman_collector_pods",
            "Pods of the last published snapshot, by health and the reason a pod is unhealthy.",
            labels=["pool", "health", "reason"],
        )
        for (ok, reason), count in sorted(Tally((pod.healthy, pod.reason) for pod in pods).items()):
            by_health.add_metric([self._pool, "healthy" if ok else "unhealthy", reason], count)
        yield by_health
        if snapshot is not None:
            age = GaugeMetricFamily(
                "pointsman_collector_snapshot_age_seconds",
                "Seconds since the last snapshot Redis accepted was built.",
                labels=["pool"],
            )
            age.add_metric([self._pool], max(0.0, self._clock() - snapshot.published_at))
            yield age
        # Upstream's pool gauges, averaged over the pods the picker would use.
        ready = [pod for pod in pods if pod.healthy]
        name = [self._pool]
        ready_pods = GaugeMetricFamily(
            "inference_pool_ready_pods", "Pods of the pool with current data.", labels=["name"]
        )
        ready_pods.add_metric(name, len(ready))
        yield ready_pods
        if ready:
            avg_kv = GaugeMetricFamily(
                "inference_pool_average_kv_cache_utilization",
                "Mean KV-cache use of the pool's ready pods.",
                labels=["name"],
            )
            avg_kv.add_metric(name, sum(pod.kv_cache_usage for pod in ready) / len(ready))
            avg_queue = GaugeMetricFamily(
                "inference_pool_average_queue_size",
                "Mean waiting queue of the pool's ready pods.",
                labels=["name"],
            )
            avg_queue.add_metric(name, sum(pod.waiting for pod in ready) / len(ready))
            yield from (avg_kv, avg_queue)


class LoopCollector(Collector):
    """The event loop's tasks not done yet, read at scrape time (the scrapes run on callbacks, so this
    counts the publisher, the sources, the membership and HTTP): a leak shows as growth under steady load
    (``make soak`` watches it)."""

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return self.collect()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "pointsman_collector_event_loop_tasks",
            "asyncio tasks of the collector's event loop not done yet.",
            value=loop_tasks(),
        )


def loop_tasks() -> int:
    """Tasks not done yet in the running event loop; 0 outside one (a scrape from another thread)."""
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:
        return 0


class ShareCollector(Collector):
    """This replica's part of the pool, read at scrape time: the pods it scrapes and the replicas holding
    a lease (with ``collector.sharing`` off, every pod and 1)."""

    def __init__(self, pool: str, *, owned: Callable[[], int], replicas: Callable[[], int]) -> None:
        self._pool = pool
        self._owned = owned
        self._replicas = replicas

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return self.collect()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        owned = GaugeMetricFamily(
            "pointsman_collector_owned_pods", "Pods of the pool this replica scrapes.", labels=["pool"]
        )
        owned.add_metric([self._pool], self._owned())
        replicas = GaugeMetricFamily(
            "pointsman_collector_live_replicas",
            "Collector replicas sharing the pool (holding a lease), as this replica last saw them.",
            labels=["pool"],
        )
        replicas.add_metric([self._pool], self._replicas())
        yield from (owned, replicas)


class ClusterMetrics:
    """The cluster objects' watch and publish: failures counted as they happen, the objects and the
    watches' states read at scrape time from the last set (:class:`ClusterCollector`)."""

    def __init__(self, registry: CollectorRegistry, objects: Callable[[], ClusterObjects]) -> None:
        self.watch_failures = Counter(
            "pointsman_collector_cluster_watch_failures",
            "Failed lists or watches of InferenceObjectives and InferenceModelRewrites, by kind, API "
            "version and the state they led to (absent: no CRD; forbidden: no RBAC; failing: other).",
            ["kind", "api_version", "state"],
            registry=registry,
        )
        self.publish_errors = Counter(
            "pointsman_collector_cluster_publish_errors",
            "Failed writes of the cluster objects to Redis, by reason.",
            ["reason"],
            registry=registry,
        )
        for reason in PUBLISH_REASONS:
            self.publish_errors.labels(reason)
        registry.register(ClusterCollector(objects))

    def watch_failed(self, kind: str, api_version: str, state: str) -> None:
        self.watch_failures.labels(kind, api_version, state).inc()

    def publish_failed(self, reason: str) -> None:
        self.publish_errors.labels(reason).inc()


class ClusterCollector(Collector):
    """Gauges of the last set of cluster objects: each watch's state, each object applied or refused."""

    def __init__(self, objects: Callable[[], ClusterObjects]) -> None:
        self._objects = objects

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        objects = self._objects()
        watches = GaugeMetricFamily(
            "pointsman_collector_cluster_watch_state",
            "1 for the state each kind and API version is in: watching, absent (no CRD), forbidden "
            "(no RBAC), failing.",
            labels=["kind", "api_version", "state"],
        )
        for watch in objects.watches:
            for state in WATCH_STATES:
                watches.add_metric([watch.kind, watch.api_version, state], float(state == watch.status))
        applied = GaugeMetricFamily(
            "pointsman_collector_cluster_objects",
            "The pool's InferenceObjectives and InferenceModelRewrites by kind, API version, name and "
            "result (applied, refused: the reason is in the log and /v1/pool); the value is the "
            "object's generation.",
            labels=["kind", "api_version", "name", "result"],
        )
        for o in objects.objectives:
            applied.add_metric([OBJECTIVE, o.api_version, o.name, "applied"], o.generation)
        for r in objects.rewrites:
            applied.add_metric([REWRITE, r.api_version, r.name, "applied"], r.generation)
        for x in objects.refused:
            applied.add_metric([x.kind, x.api_version, x.name, "refused"], x.generation)
        yield from (watches, applied)
