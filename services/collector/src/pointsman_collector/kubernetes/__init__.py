"""Pods from Kubernetes: the InferencePool named in the config, and the Ready pods its selector matches;
and the pool's InferenceObjectives and InferenceModelRewrites.

- :mod:`.objects`: the pool's selector and ports, and which pods count (pure);
- :mod:`.credentials`: how to reach the API server (in-cluster service account or kubeconfig);
- :mod:`.watch`: following the pool and its pods with list/watch, retrying with backoff;
- :mod:`.cluster_objects`: objectives and rewrites read into the published set, invalid ones refused (pure);
- :mod:`.cluster_watch`: following them in both API groups, and their Accepted condition.

The names used outside the package are re-exported here.
"""

from __future__ import annotations

from pointsman_collector.kubernetes.credentials import KubeAccess, from_kubeconfig, in_cluster
from pointsman_collector.kubernetes.watch import KubernetesTargets

__all__ = ["KubeAccess", "KubernetesTargets", "from_kubeconfig", "in_cluster"]
