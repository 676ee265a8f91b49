"""The collector's HTTP surface: probes, Prometheus metrics, and the published pool as JSON."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import orjson
from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from pointsman_shared.cluster import ClusterObjects
from pointsman_shared.cluster_codec import cluster_to_dict
from pointsman_shared.codec import pod_to_dict
from pointsman_shared.snapshot import PoolSnapshot


class CollectorView(Protocol):
    """What the HTTP surface reads from the running collector."""

    @property
    def published(self) -> PoolSnapshot | None: ...

    def readiness(self) -> str | None: ...


def create_app(
    collector: CollectorView,
    *,
    registry: CollectorRegistry,
    cluster: Callable[[], ClusterObjects] | None = None,
) -> FastAPI:
    """``cluster``: the cluster objects last read, shown in ``/v1/pool`` (none when not watched)."""
    # Handlers are async on purpose: each is quick, and sync handlers would hop to a thread pool.
    app = FastAPI(title="pointsman-collector", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/healthz")
    async def healthz() -> Response:
        return _json({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        reason = collector.readiness()
        if reason is not None:
            return _json({"status": "not ready", "reason": reason}, status=503)
        return _json({"status": "ready"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/pool")
    async def pool() -> Response:
        snapshot = collector.published
        if snapshot is None:
            return _json({"status": "not ready", "reason": "no snapshot published yet"}, status=503)
        body = {
            "pool": snapshot.pool,
            "version": snapshot.version,
            "publishedAt": snapshot.published_at,
            "pods": [pod_to_dict(pod) for pod in snapshot.pods],
        }
        if cluster is not None:
            body["cluster"] = cluster_to_dict(cluster())
        return _json(body)

    return app


def _json(body: dict[str, Any], status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")
