"""Whether this collector shares its pool with other replicas, decided once.

``collector.sharing`` changes three parts of the assembled collector: the sink (this replica's shard,
merged with the others', or the whole pool), a membership in Redis (the replicas' leases), and so a
Redis client even when the caller brings its own sink (as publishing the cluster objects does).
:func:`Topology.of` decides them together from the config and what the caller passed in;
:func:`~pointsman_collector.assembly.create_collector` builds what it says. Alone or not, the endpoints
reach the scrape loops through a :class:`~pointsman_collector.sharing.Share`: alone, its only member is
this replica, so it owns every pod.
"""

from __future__ import annotations

from dataclasses import dataclass

from pointsman_shared.config import CollectorConfig


@dataclass(frozen=True, slots=True)
class Topology:
    me: str  # this replica's name among the pool's members (and in the logs)
    shared: bool  # replicas split the pods by their leases and publish one merged snapshot
    opens_redis: bool  # a Redis client is made here, and closed with the collector

    @classmethod
    def of(
        cls,
        settings: CollectorConfig,
        *,
        me: str,
        redis_given: bool,
        sink_given: bool,
        publishes_cluster: bool = False,
    ) -> Topology:
        """``redis_given``/``sink_given``: the caller passed its own Redis client or sink;
        ``publishes_cluster``: the collector publishes the pool's cluster objects too. A shared
        collector needs Redis for its membership, and a cluster publisher for the objects, even when
        the caller brings the sink."""
        shared = settings.sharing
        needs_redis = shared or not sink_given or publishes_cluster
        return cls(me, shared, opens_redis=not redis_given and needs_redis)
