"""Where the pool's cluster objects go: the ``cluster`` hash beside the snapshot (docs/redis-schema.md).

A new set is written at once, with a notification on the pool's channel so every picker reads it on
the spot; the same set is written again every :data:`REWRITE` seconds without one, so a Redis that lost
its data (restarted, failed over to an empty replica) has it back within that. A failed write is
counted by reason and retried at the next change or rewrite; the pickers keep the last set meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from redis.exceptions import RedisError

from pointsman_collector.sink import publish_error, run_script
from pointsman_shared.aio import wait_event
from pointsman_shared.cluster import ClusterObjects
from pointsman_shared.cluster_codec import encode_cluster, stamp
from pointsman_shared.keys import RedisKeys
from pointsman_shared.redis_client import RedisClient

log = logging.getLogger(__name__)

REWRITE = 1.0

# KEYS: the cluster hash, the channel (one hash slot). ARGV: stamp, blob, "1" to notify.
_WRITE = """
redis.call('HSET', KEYS[1], 'stamp', ARGV[1], 'data', ARGV[2])
if ARGV[3] == '1' then redis.call('PUBLISH', KEYS[2], 'cluster ' .. ARGV[1]) end
return 1
"""


class ClusterSink:
    def __init__(
        self,
        client: RedisClient,
        keys: RedisKeys,
        *,
        on_error: Callable[[str], None] | None = None,
        rewrite: float = REWRITE,
    ) -> None:
        self._keys = (keys.cluster, keys.channel)
        self._script = client.register_script(_WRITE)
        self._on_error = on_error
        self._rewrite = rewrite
        self._objects: ClusterObjects | None = None
        self._written: str | None = None  # the stamp Redis has, as far as we know
        self._wake = asyncio.Event()
        self.writes = 0

    def set(self, objects: ClusterObjects) -> None:
        """Publish ``objects`` (at once, from the running :meth:`run`)."""
        self._objects = objects
        self._wake.set()

    async def write(self) -> bool:
        """Write the current set once (notifying when it changed); ``False`` when it failed."""
        if self._objects is None:
            return True
        blob = encode_cluster(self._objects)
        digest = stamp(blob)
        changed = digest != self._written
        try:
            await run_script(self._script, self._keys, (digest, blob, "1" if changed else "0"))
        except (RedisError, OSError) as exc:
            error = publish_error(exc)
            if self._on_error is not None:
                self._on_error(error.reason)
            log.warning("cannot write the cluster objects to Redis (pickers keep the last set): %s", error)
            self._written = None  # notify when it works again
            return False
        if changed:
            log.info(
                "cluster objects published: %d objectives, %d rewrites, %d refused",
                len(self._objects.objectives),
                len(self._objects.rewrites),
                len(self._objects.refused),
            )
        self._written = digest
        self.writes += 1
        return True

    async def run(self) -> None:
        while True:
            self._wake.clear()
            await self.write()
            await wait_event(self._wake, self._rewrite)
