"""Properties of reading the Kubernetes API's objects (``kubernetes/objects.py``) shaped like InferencePools
and Pods with anything anywhere: a :class:`DiscoveryError` or a valid result, never another exception,
and a pod list or event that is refused leaves the pod table as it was."""

from __future__ import annotations

import copy
import ipaddress
from typing import Any

from hypothesis import event, given
from hypothesis import strategies as st
from kube_api import ALPHA2, V1, recorded

from pointsman_collector.errors import DiscoveryError
from pointsman_collector.kubernetes.objects import PodTable, PoolSpec, pool_spec, ready_ip
from pointsman_shared.config import split_host_port

POOLS = {V1: recorded("inferencepool-v1"), ALPHA2: recorded("inferencepool-v1alpha2")}
POD = recorded("pod")
SELECTOR = (("app", "vllm-llama3-8b-instruct"),)

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
# Values where a field is read: the right type with odd contents, or the wrong type.
ODD = st.one_of(
    JSON,
    st.sampled_from(["True", "False", "Ready", "", "10.0.0.9", "fd00::9", "[x", "10.0.0.1:80", "not an ip"]),
    st.sampled_from([0, 1, 8000, 65535, 65536, -1, True, 8000.0]),
    st.just([{"number": 8000}, {"number": "8001"}]),
    st.just({"matchLabels": {"app": "vllm-llama3-8b-instruct"}}),
)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value."""
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            found += paths(child, (*prefix, i))
    return found


@st.composite
def mutated(draw: st.DrawFn, original: dict[str, Any]) -> Any:
    """``original`` with a few values replaced (or keys removed) anywhere, its root included."""
    obj: Any = copy.deepcopy(original)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths(obj)))
        if not path:
            obj = copy.deepcopy(draw(ODD))
            continue
        parent = obj
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and draw(st.integers(0, 3)) == 0:
            del parent[path[-1]]
        else:
            parent[path[-1]] = copy.deepcopy(draw(ODD))  # never a value shared with another place
    return obj


def pods(name: str, ip: str, ready: bool = True) -> dict[str, Any]:
    obj = copy.deepcopy(POD)
    obj["metadata"]["name"] = name
    obj["status"]["podIP"] = ip
    for condition in obj["status"]["conditions"]:
        if condition["type"] == "Ready":
            condition["status"] = "True" if ready else "False"
    return obj


GOOD_PODS = st.builds(
    pods,
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(["10.0.0.1", "10.0.0.2", "fd00::1"]),
    st.booleans(),
)
ANY_POD = GOOD_PODS | GOOD_PODS.flatmap(mutated) | JSON


@given(st.sampled_from([V1, ALPHA2]).flatmap(lambda v: st.tuples(st.just(v), mutated(POOLS[v]) | JSON)))
def test_any_pool_object_gives_a_spec_or_a_discovery_error(case: tuple[str, Any]) -> None:
    api_version, pool = case
    try:
        spec = pool_spec(pool, api_version)
    except DiscoveryError as exc:
        reason = exc.reason
    else:
        event("spec")
        check_spec(spec)
        return
    event("refused")
    assert reason == "kubernetes"


def check_spec(spec: PoolSpec) -> None:
    assert isinstance(spec, PoolSpec)
    assert spec.selector
    assert list(spec.selector) == sorted(spec.selector)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in spec.selector)
    assert spec.ports
    assert len(set(spec.ports)) == len(spec.ports)
    assert all(type(p) is int and 0 < p < 65536 for p in spec.ports)


@given(ANY_POD)
def test_any_pod_object_is_an_ip_nothing_or_a_discovery_error(obj: Any) -> None:
    try:
        ip = ready_ip(obj)
    except DiscoveryError as exc:
        reason = exc.reason
    else:
        event("no ip" if ip is None else "ip")
        if ip is not None:
            ipaddress.ip_address(ip)  # an address the collector can dial
        return
    event("refused")
    assert reason == "kubernetes"


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["reset", "ADDED", "MODIFIED", "DELETED", "BOOKMARK"]),
            st.lists(ANY_POD, max_size=3),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_the_pod_table_applies_a_list_or_an_event_whole_or_not_at_all(
    steps: list[tuple[str, list[Any]]],
) -> None:
    table = PodTable(SELECTOR)
    for kind, objects in steps:
        before = table.endpoints((8000,))
        try:
            if kind == "reset":
                table.reset(objects)
            else:
                for obj in objects[:1]:
                    table.apply(kind, obj)
        except DiscoveryError:
            event("refused")
            assert table.endpoints((8000,)) == before  # nothing half-applied
            continue
        endpoints = table.endpoints((8000, 8001))
        assert list(endpoints) == sorted(endpoints)
        for endpoint in endpoints:
            host, port = split_host_port(endpoint)  # what the scraper will be given
            ipaddress.ip_address(host)
            assert port in (8000, 8001)
