"""Where a pool's state lives in Redis. Documented in docs/redis-schema.md."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RedisKeys:
    pool: str
    prefix: str = "pointsman"

    @property
    def _base(self) -> str:
        # The hash tag keeps a pool's keys in one slot, so the publish script works on Redis Cluster.
        return f"{self.prefix}:{{{self.pool}}}"

    @property
    def snapshot(self) -> str:
        """Hash ``{version, data}``: the newest pool snapshot and its version, written together."""
        return f"{self._base}:snapshot"

    @property
    def cluster(self) -> str:
        """Hash ``{stamp, data}``: the pool's InferenceObjectives and InferenceModelRewrites from the
        cluster (``cluster_codec``) and the blob's digest; no expiry, so pickers keep the last set."""
        return f"{self._base}:cluster"

    @property
    def sequence(self) -> str:
        """Counter behind ``version``; never expires, so versions only grow across collector restarts."""
        return f"{self._base}:seq"

    @property
    def members(self) -> str:
        """Sorted set of live collector replicas; each score is the member's lease expiry (Redis ms)."""
        return f"{self._base}:members"

    @property
    def shards(self) -> str:
        """Hash: each sharing replica's pods, from which the snapshot is assembled."""
        return f"{self._base}:shards"

    @property
    def channel(self) -> str:
        """Pub/sub channel; each message is the version just published."""
        return f"{self._base}:updates"

    @property
    def prefix_index(self) -> str:
        """Stream: the pickers' prefix-cache announcements, one entry per batch (docs/redis-schema.md)."""
        return f"{self._base}:prefix"

    @property
    def dispatches(self) -> str:
        """Hash: each picker's flow-control report (its recent dispatches per pod, its queue length),
        by picker id (docs/redis-schema.md)."""
        return f"{self._base}:dispatches"
