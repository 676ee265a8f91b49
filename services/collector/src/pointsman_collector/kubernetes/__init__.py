"""Pods from Kubernetes: the InferencePool named in the config, and the Ready pods its selector matches.

- :mod:`.objects`: the pool's selector and ports, and which pods count (pure);
- :mod:`.credentials`: how to reach the API server (in-cluster service account or kubeconfig);
- :mod:`.watch`: following the pool and its pods with list/watch, retrying with backoff.

The names used outside the package are re-exported here.
"""

from __future__ import annotations

from pointsman_collector.kubernetes.credentials import KubeAccess, from_kubeconfig, in_cluster
from pointsman_collector.kubernetes.watch import KubernetesTargets

__all__ = ["KubeAccess", "KubernetesTargets", "from_kubeconfig", "in_cluster"]
