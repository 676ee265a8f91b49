"""Reading InferencePool and Pod objects (``kubernetes/objects.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from kube_api import ALPHA2, V1, pod, recorded

from pointsman_collector.errors import DiscoveryError
from pointsman_collector.kubernetes.objects import PodTable, pool_spec, ready_ip


@pytest.mark.parametrize(
    ("api_version", "spec", "selector", "ports"),
    [
        (ALPHA2, {"selector": {"app": "x"}, "targetPortNumber": 8000}, (("app", "x"),), (8000,)),
        (
            V1,
            {
                "selector": {"matchLabels": {"b": "2", "a": "1"}},
                "targetPorts": [{"number": 1}, {"number": 2}, {"number": 1}],
            },
            (("a", "1"), ("b", "2")),
            (1, 2),
        ),
        # A v1alpha2 selector may have a label named matchLabels: it is read as a label, not a LabelSelector.
        (ALPHA2, {"selector": {"matchLabels": "x"}, "targetPortNumber": 1}, (("matchLabels", "x"),), (1,)),
    ],
    ids=["v1alpha2", "v1", "v1alpha2 label named matchLabels"],
)
def test_pool_spec(
    api_version: str, spec: dict[str, Any], selector: tuple[tuple[str, str], ...], ports: tuple[int, ...]
) -> None:
    got = pool_spec({"spec": spec}, api_version)
    assert (got.selector, got.ports) == (selector, ports)


@pytest.mark.parametrize(
    ("name", "api_version"), [("inferencepool-v1", V1), ("inferencepool-v1alpha2", ALPHA2)]
)
def test_pool_spec_of_recorded_pools(name: str, api_version: str) -> None:
    got = pool_spec(recorded(name), api_version)
    assert got.label_selector == "app=vllm-llama3-8b-instruct"
    assert got.ports == ((8000, 8001) if api_version == V1 else (8000,))


@pytest.mark.parametrize(
    ("api_version", "spec"),
    [
        (ALPHA2, {}),
        (ALPHA2, {"selector": {}, "targetPortNumber": 8000}),
        (ALPHA2, {"selector": {"app": "x"}}),
        (ALPHA2, {"selector": {"app": "x"}, "targetPortNumber": 0}),
        (ALPHA2, {"selector": {"app": "x"}, "targetPorts": [{"number": 8000}]}),  # v1's field
        (V1, {"selector": {"matchLabels": {"app": "x"}}, "targetPorts": []}),
        (V1, {"selector": {"matchLabels": {"app": "x"}}, "targetPortNumber": 8000}),  # v1alpha2's field
        (V1, {"selector": {"app": "x"}, "targetPorts": [{"number": 1}]}),  # v1alpha2's selector
        (V1, {"selector": {"matchLabels": {"app": "x"}}, "targetPorts": [{"number": 70000}]}),
        (
            V1,
            {
                "selector": {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
                "targetPorts": [{"number": 1}],
            },
        ),
        ("inference.networking.k8s.io/v2", {"selector": {"matchLabels": {"a": "1"}}, "targetPorts": [1]}),
    ],
    ids=[
        "empty",
        "no labels",
        "no port",
        "port 0",
        "v1 ports in v1alpha2",
        "no ports",
        "v1alpha2 port in v1",
        "flat selector in v1",
        "port too big",
        "expressions",
        "unknown version",
    ],
)
def test_unusable_pools(api_version: str, spec: dict[str, Any]) -> None:
    with pytest.raises(DiscoveryError):
        pool_spec({"spec": spec}, api_version)


def test_a_pool_of_another_version_than_asked_for_is_refused() -> None:
    with pytest.raises(DiscoveryError, match=r"expected 'inference\.networking\.x-k8s\.io/v1alpha2'"):
        pool_spec(recorded("inferencepool-v1"), ALPHA2)


@pytest.mark.parametrize(
    ("obj", "ip"),
    [
        (pod("a", "10.0.0.1"), "10.0.0.1"),
        (pod("a", "10.0.0.1", ready=False), None),
        (pod("a", None), None),
        (
            {**pod("a", "10.0.0.1"), "metadata": {"name": "a", "deletionTimestamp": "2026-11-30T20:00:00Z"}},
            None,
        ),
        ({"metadata": {"name": "a"}, "status": {"podIP": "10.0.0.1"}}, None),
    ],
    ids=["ready", "not ready", "no ip", "terminating", "no conditions"],
)
def test_ready_ip(obj: dict[str, Any], ip: str | None) -> None:
    assert ready_ip(obj) == ip


def test_every_pod_is_an_endpoint_on_every_port() -> None:
    table = PodTable()
    table.reset([pod("a", "10.0.0.1"), pod("b", "fd00::2"), pod("c", "10.0.0.3", ready=False)])
    assert table.endpoints((8000, 8001)) == (
        "10.0.0.1:8000",
        "10.0.0.1:8001",
        "[fd00::2]:8000",
        "[fd00::2]:8001",
    )


def test_pod_table_keys_by_name_and_dedups_ips() -> None:
    table = PodTable()
    table.reset([pod("a", "10.0.0.1"), pod("b", "10.0.0.1"), pod("c", "fd00::1")])
    assert table.endpoints((8000,)) == ("10.0.0.1:8000", "[fd00::1]:8000")
    table.apply("DELETED", pod("a", "10.0.0.1"))
    assert table.endpoints((8000,)) == ("10.0.0.1:8000", "[fd00::1]:8000")


def _with(obj: dict[str, Any], section: str, key: str | None, value: Any) -> dict[str, Any]:
    obj = {**obj, section: dict(obj[section])}
    if key is None:
        obj[section] = value
    else:
        obj[section][key] = value
    return obj


# Found by test_collector_kubernetes_properties: each raised AttributeError or TypeError.
@pytest.mark.parametrize(
    "obj",
    [
        _with(pod("a", "10.0.0.1"), "metadata", None, ["a"]),
        _with(pod("a", "10.0.0.1"), "metadata", "labels", "app=vllm"),
        _with(pod("a", "10.0.0.1"), "status", None, "Running"),
        _with(pod("a", "10.0.0.1"), "status", "conditions", {"type": "Ready"}),
        _with(pod("a", "10.0.0.1"), "status", "conditions", ["Ready"]),
        _with(pod("a", "10.0.0.1"), "status", "podIP", "[x"),
        ["not", "a", "pod"],
    ],
    ids=[
        "metadata a list",
        "labels a string",
        "status a string",
        "conditions an object",
        "condition a string",
        "ip no address",
        "pod a list",
    ],
)
def test_a_pod_not_shaped_like_the_api_s_is_a_discovery_error_and_changes_nothing(obj: Any) -> None:
    table = PodTable((("app", "vllm-llama3-8b-instruct"),))
    table.reset([pod("b", "10.0.0.2")])
    with pytest.raises(DiscoveryError):
        table.reset([pod("c", "10.0.0.3"), obj])
    with pytest.raises(DiscoveryError):
        table.apply("MODIFIED", obj)
    assert table.endpoints((8000,)) == ("10.0.0.2:8000",)


@pytest.mark.parametrize("obj", [None, [], "pool"])
def test_a_pool_that_is_no_object_is_a_discovery_error(obj: Any) -> None:
    with pytest.raises(DiscoveryError, match="not an object"):
        pool_spec(obj, V1)
