"""What ``collector.sharing`` and the parts a caller passes in decide, in one table."""

from __future__ import annotations

import pytest

from pointsman_collector.topology import Topology
from pointsman_shared.config import CollectorConfig


@pytest.mark.parametrize(
    ("sharing", "redis_given", "sink_given", "shared", "opens_redis"),
    [
        (False, False, False, False, True),  # the Redis sink, on a client of its own
        (False, True, False, False, False),  # the Redis sink, on the caller's client
        (False, False, True, False, False),  # the caller's sink: no Redis at all
        (False, True, True, False, False),
        (True, False, False, True, True),  # a shard sink and a membership, on a client of its own
        (True, True, False, True, False),
        (True, False, True, True, True),  # the caller's sink, and still Redis for the membership
        (True, True, True, True, False),
    ],
)
def test_sharing_and_the_parts_given_decide_the_topology(
    sharing: bool, redis_given: bool, sink_given: bool, shared: bool, opens_redis: bool
) -> None:
    settings = CollectorConfig.model_validate({"sharing": sharing})
    topology = Topology.of(settings, me="replica-1", redis_given=redis_given, sink_given=sink_given)
    assert topology == Topology("replica-1", shared=shared, opens_redis=opens_redis)


@pytest.mark.parametrize(
    ("redis_given", "sink_given", "opens_redis"),
    [
        (False, True, True),  # the caller's sink, and still Redis for the cluster objects
        (True, True, False),  # the caller's client carries them
        (False, False, True),
    ],
)
def test_publishing_the_cluster_objects_needs_redis_even_beside_the_caller_s_sink(
    redis_given: bool, sink_given: bool, opens_redis: bool
) -> None:
    settings = CollectorConfig.model_validate({"sharing": False})
    topology = Topology.of(
        settings, me="replica-1", redis_given=redis_given, sink_given=sink_given, publishes_cluster=True
    )
    assert topology == Topology("replica-1", shared=False, opens_redis=opens_redis)
