"""Reading InferencePool and Pod objects (``kubernetes/objects.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from kube_api import pod

from pointsman_collector.errors import DiscoveryError
from pointsman_collector.kubernetes.objects import PodTable, pool_spec, ready_ip


@pytest.mark.parametrize(
    ("spec", "selector", "ports"),
    [
        ({"selector": {"app": "x"}, "targetPortNumber": 8000}, (("app", "x"),), (8000,)),
        (
            {
                "selector": {"matchLabels": {"b": "2", "a": "1"}},
                "targetPorts": [{"number": 1}, {"number": 2}],
            },
            (("a", "1"), ("b", "2")),
            (1, 2),
        ),
    ],
    ids=["v1alpha2", "v1"],
)
def test_pool_spec(
    spec: dict[str, Any], selector: tuple[tuple[str, str], ...], ports: tuple[int, ...]
) -> None:
    got = pool_spec({"spec": spec})
    assert (got.selector, got.ports) == (selector, ports)


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"selector": {}, "targetPortNumber": 8000},
        {"selector": {"app": "x"}},
        {"selector": {"app": "x"}, "targetPortNumber": 0},
        {"selector": {"app": "x"}, "targetPorts": []},
        {
            "selector": {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
            "targetPorts": [{"number": 1}],
        },
    ],
    ids=["empty", "no labels", "no port", "port 0", "no ports", "expressions"],
)
def test_unusable_pools(spec: dict[str, Any]) -> None:
    with pytest.raises(DiscoveryError):
        pool_spec({"spec": spec})


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


def test_pod_table_keys_by_name_and_dedups_ips() -> None:
    table = PodTable()
    table.reset([pod("a", "10.0.0.1"), pod("b", "10.0.0.1"), pod("c", "fd00::1")])
    assert table.endpoints((8000,)) == ("10.0.0.1:8000", "[fd00::1]:8000")
    table.apply("DELETED", pod("a", "10.0.0.1"))
    assert table.endpoints((8000,)) == ("10.0.0.1:8000", "[fd00::1]:8000")
