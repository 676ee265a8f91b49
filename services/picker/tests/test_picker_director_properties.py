"""Properties of the director (``director.py``) over snapshots another writer may have left in Redis: any
snapshot the codec decodes (negative or huge counts, KV use out of range, duplicate or odd addresses, old
or future times) routes a request to one of its pods or to a configured endpoint, or fails with a
:class:`PickerError`; never another exception."""

from __future__ import annotations

import random
import time

from hypothesis import event, given
from hypothesis import strategies as st
from picker_builders import NOW, config, ctx
from prometheus_client import CollectorRegistry

from pointsman_picker import errors
from pointsman_picker.director import Director
from pointsman_picker.metrics import PickerMetrics
from pointsman_picker.snapshots import StaticSnapshotSource
from pointsman_shared.codec import decode_pool, encode_pool
from pointsman_shared.snapshot import FieldTimes, PodSnapshot, PoolSnapshot

INTS = st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.integers(-3, 300)
FLOATS = st.floats(allow_nan=False, allow_infinity=False) | st.floats(-1, 2)
TIMES = st.sampled_from([NOW, NOW - 1, NOW - 10, NOW + 100, 0.0]) | FLOATS
ADAPTERS = st.frozensets(
    st.sampled_from(["my-model-12345", "sql-lora-1fdg2", "sql-lora-1fdg3", "x", ""]), max_size=3
)
PODS = st.builds(
    PodSnapshot,
    address=st.sampled_from(["10.0.0.1:8000", "10.0.0.2:8000", "", "[::1]:1"]) | st.text(max_size=6),
    waiting=INTS,
    running=INTS,
    kv_cache_usage=FLOATS,
    max_lora=INTS,
    running_adapters=ADAPTERS,
    waiting_adapters=ADAPTERS,
    updated_at=TIMES,
    healthy=st.booleans(),
    reason=st.text(max_size=4),
    field_times=st.builds(FieldTimes, waiting=TIMES, running=TIMES, kv_cache_usage=TIMES, lora=TIMES),
)
SNAPSHOTS = st.builds(
    PoolSnapshot,
    pool=st.just("test-pool"),
    version=st.integers(0, 10),
    published_at=TIMES,
    pods=st.lists(PODS, max_size=5).map(tuple),  # duplicates allowed: the codec does not refuse them
)
BODIES = st.sampled_from(
    [
        b'{"model":"my-model"}',
        b'{"model":"sql-lora"}',
        b'{"model":"sql-lora-sheddable"}',
        b'{"model":"plain"}',
        None,
    ]
)
PROFILES = st.sampled_from([{}, {"picker": {"profile": "scorer"}}, {"picker": {"countAssignments": False}}])
FAILURE_MODES = st.sampled_from(["FailClose", "FailOpen"])


@given(SNAPSHOTS, st.lists(BODIES, min_size=1, max_size=4), PROFILES, FAILURE_MODES)
def test_any_decoded_snapshot_routes_to_one_of_its_pods_or_fails_as_a_picker_error(
    written: PoolSnapshot, bodies: list[bytes | None], sections: dict[str, dict[str, object]], mode: str
) -> None:
    snapshot = decode_pool(encode_pool(written), written.version)  # what a picker reads back
    cfg = config(pool={"name": "test-pool", "targetPort": 8000, "failureMode": mode}, **sections)
    director = Director(
        cfg,
        StaticSnapshotSource(snapshot),
        PickerMetrics(CollectorRegistry()),
        rng=random.Random(0),
        clock=lambda: NOW,
        timer=time.perf_counter,
    )
    addresses = {pod.address for pod in snapshot.pods}
    for body in bodies:
        try:
            routing = director.route(ctx(body))
        except errors.PickerError as exc:
            status = exc.status
        else:
            event("routed")
            assert routing.endpoint in addresses
            director.release(routing)
            continue
        event(f"{status}")
        assert status in (404, 429, 503)
