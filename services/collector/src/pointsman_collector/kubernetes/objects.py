"""InferencePool and Pod objects as the API server returns them, read into what discovery needs. Pure.

An InferencePool gives a selector and target ports, read as its API version writes them:

- ``inference.networking.k8s.io/v1`` (GIE v1.0+): ``spec.selector.matchLabels`` and
  ``spec.targetPorts[].number``;
- ``inference.networking.x-k8s.io/v1alpha2`` (GIE v0.x): ``spec.selector`` (the labels) and
  ``spec.targetPortNumber``.

Every pod is an endpoint on every target port (data-parallel ranks on several ports are separate
endpoints). A pod counts while it is Ready, has an IP and is not being deleted.

An object not shaped like the API's (a field of another JSON type, a pod IP that is no IP address) is a
:class:`DiscoveryError`, never another exception; a pod list with one is refused whole.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pointsman_collector.errors import DiscoveryError
from pointsman_shared.config import INFERENCE_POOL_V1, INFERENCE_POOL_V1ALPHA2, join_host_port


@dataclass(frozen=True, slots=True)
class PoolSpec:
    selector: tuple[tuple[str, str], ...]  # matchLabels, sorted
    ports: tuple[int, ...]

    @property
    def label_selector(self) -> str:
        return ",".join(f"{key}={value}" for key, value in self.selector)


def pool_spec(pool: Mapping[str, Any], api_version: str) -> PoolSpec:
    """The selector and ports of an InferencePool of ``api_version``; raise :class:`DiscoveryError`.

    An object that names another apiVersion than the one asked for is refused, not guessed at.
    """
    if not isinstance(pool, Mapping):
        raise DiscoveryError("kubernetes", f"InferencePool is not an object: {type(pool).__name__}")
    found = pool.get("apiVersion", api_version)
    if found != api_version:
        raise DiscoveryError("kubernetes", f"InferencePool is {found!r}, expected {api_version!r}")
    spec = pool.get("spec")
    if not isinstance(spec, dict):
        raise DiscoveryError("kubernetes", "InferencePool has no spec")
    if api_version == INFERENCE_POOL_V1:
        selector, raw_ports = _v1(spec)
    elif api_version == INFERENCE_POOL_V1ALPHA2:
        selector, raw_ports = spec.get("selector"), [spec.get("targetPortNumber")]
    else:
        raise DiscoveryError("kubernetes", f"InferencePool apiVersion {api_version!r} is not supported")
    if not isinstance(selector, dict) or not selector:
        raise DiscoveryError("kubernetes", "InferencePool has no selector labels")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in selector.items()):
        raise DiscoveryError("kubernetes", "InferencePool selector labels must be strings")
    ports: list[int] = []
    for port in raw_ports:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise DiscoveryError("kubernetes", f"InferencePool target port {port!r} is not a port")
        if port not in ports:
            ports.append(port)
    if not ports:
        raise DiscoveryError("kubernetes", "InferencePool has no target port")
    return PoolSpec(tuple(sorted(selector.items())), tuple(ports))


def _v1(spec: Mapping[str, Any]) -> tuple[object, list[object]]:
    selector = spec.get("selector")
    if not isinstance(selector, dict):
        raise DiscoveryError("kubernetes", "InferencePool has no spec.selector")
    if selector.get("matchExpressions"):  # not in the v1 schema; refused should a later one add it
        raise DiscoveryError("kubernetes", "InferencePool selector.matchExpressions is not supported")
    target_ports = spec.get("targetPorts")
    if not isinstance(target_ports, list):
        raise DiscoveryError("kubernetes", "InferencePool has no spec.targetPorts")
    return selector.get("matchLabels"), [
        p.get("number") if isinstance(p, dict) else None for p in target_ports
    ]


def ready_ip(pod: Mapping[str, Any]) -> str | None:
    """The pod's IP while it is Ready and not being deleted, else ``None``."""
    metadata = _object(pod, "pod", "metadata")
    if metadata.get("deletionTimestamp"):
        return None
    status = _object(pod, "pod", "status")
    ip = status.get("podIP")
    if not isinstance(ip, str) or not ip:
        return None
    conditions = status.get("conditions") or []
    if not isinstance(conditions, list):
        raise DiscoveryError("kubernetes", "pod status.conditions is not a list")
    for condition in conditions:
        if not isinstance(condition, Mapping):
            raise DiscoveryError("kubernetes", "pod status.conditions holds a non-object")
        if condition.get("type") == "Ready":
            return _address(ip) if condition.get("status") == "True" else None
    return None


def _object(parent: Any, what: str, field: str) -> Mapping[str, Any]:
    """``parent[field]``, a JSON object (absent or null: an empty one)."""
    if not isinstance(parent, Mapping):
        raise DiscoveryError("kubernetes", f"{what} is not an object: {type(parent).__name__}")
    value = parent.get(field) or {}
    if not isinstance(value, Mapping):
        raise DiscoveryError("kubernetes", f"{what} {field} is not an object: {type(value).__name__}")
    return value


def _address(ip: str) -> str:
    # The collector writes it into a host:port and dials it: anything else would fail there, later.
    try:
        ipaddress.ip_address(ip)
    except ValueError:
        raise DiscoveryError("kubernetes", f"pod IP {ip[:60]!r} is not an IP address") from None
    return ip


class PodTable:
    """The Ready pods seen so far, by name, from a list and the watch events after it.

    A pod whose labels stop matching the selector leaves, whether the API server says so with a
    DELETED event (as a label-selector watch does) or sends the modified pod.
    """

    def __init__(self, selector: tuple[tuple[str, str], ...] = ()) -> None:
        self._selector = selector
        self._ips: dict[str, str] = {}

    def reset(
        self, pods: list[Mapping[str, Any]], selector: tuple[tuple[str, str], ...] | None = None
    ) -> None:
        """Start over from a full list; a list that is refused (:class:`DiscoveryError`) changes nothing."""
        if not isinstance(pods, list | tuple):
            raise DiscoveryError("kubernetes", f"the pod list's items are not a list: {type(pods).__name__}")
        wanted = self._selector if selector is None else selector
        ips: dict[str, str] = {}
        for pod in pods:
            name, ip = _entry("ADDED", pod, wanted)
            if ip is None:
                ips.pop(name, None)
            else:
                ips[name] = ip
        self._selector, self._ips = wanted, ips

    def apply(self, kind: str, pod: Mapping[str, Any]) -> None:
        name, ip = _entry(kind, pod, self._selector)
        if ip is None:
            self._ips.pop(name, None)
        else:
            self._ips[name] = ip

    def endpoints(self, ports: tuple[int, ...]) -> tuple[str, ...]:
        return tuple(sorted(join_host_port(ip, port) for ip in set(self._ips.values()) for port in ports))


def _entry(
    kind: str, pod: Mapping[str, Any], selector: tuple[tuple[str, str], ...]
) -> tuple[str, str | None]:
    """The pod's name and, while it counts, its IP."""
    metadata = _object(pod, "pod", "metadata")
    name = str(metadata.get("name", ""))
    labels = _object(metadata, "pod metadata", "labels")
    matches = all(labels.get(key) == value for key, value in selector)
    return name, None if kind == "DELETED" or not matches else ready_ip(pod)
