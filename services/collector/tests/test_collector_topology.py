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
