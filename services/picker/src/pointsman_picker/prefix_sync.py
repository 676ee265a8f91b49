"""The prefix-cache index shared by the picker replicas through Redis: the I/O side of
:class:`~pointsman_picker.scheduling.prefix_cache.PrefixCacheProducer`.

Every ``interval`` each picker takes the blocks its producer recorded since (``drain``), and appends
them to the pool's stream (``pointsman:{pool}:prefix``) in entries of at most ``batch`` block hashes,
at most ``rounds`` entries a round trip (what could not be sent goes back to the outbox);
it reads the entries appended since its last read and hands the other pickers' to its producer
(``learn``). A producer it has not fed yet (at start, or made by a config reload with other parameters)
first gets the whole stream: the current shared index. Redis keeps the stream bounded: at most
``max_entries`` entries (``XADD MAXLEN ~``), and none older than ``ttl`` (``XTRIM MINID ~``), so an
entry expires unless a picker announces the block again (a producer does so for a block it routes to
once its last announcement is ``announce_every`` old). Pods that leave the pool are purged by each
producer from its own index; entries naming them expire with the stream.

One entry: ``o`` the announcing picker, ``t`` the time of its newest block, then one field per pod
address whose value is the block hashes, 8 bytes each, little-endian. Memory in Redis: at most
``max_entries x (batch x 8 B + the addresses)``: 2,000 x 32 KiB = 64 MiB with the defaults, whatever
the pool's size (1,000 pods included).

While Redis is unreachable the picker routes by its own index alone, the outbox keeping its newest
blocks (``outbox_limit``) for when Redis answers again; nothing errors. The stream is one key with the
pool's hash tag, so it works on one server, behind Sentinel and on a cluster as the snapshot's keys do.
"""

from __future__ import annotations

import asyncio
import logging
import random
import struct
import time
from collections.abc import Callable, Iterable, Sequence

from pointsman_picker.redis_rounds import FAILURES, RedisRounds, default_origin
from pointsman_picker.scheduling.contracts import RequestPlugin
from pointsman_picker.scheduling.prefix_cache import Announcement, PrefixCacheProducer
from pointsman_picker.snapshots import RETRY
from pointsman_shared.backoff import Backoff
from pointsman_shared.keys import RedisKeys
from pointsman_shared.redis_url import RedisTarget

log = logging.getLogger(__name__)

ORIGIN = b"o"
PAGE = 1000  # entries read per XRANGE
AT = b"t"


def encode(origin: str, announcements: Sequence[Announcement]) -> dict[bytes, bytes]:
    """One stream entry: the announcements by pod, each pod's hashes in announcement order."""
    by_pod: dict[str, list[int]] = {}
    for a in announcements:
        by_pod.setdefault(a.pod, []).extend(a.hashes)
    fields = {ORIGIN: origin.encode(), AT: repr(max(a.at for a in announcements)).encode()}
    for pod, hashes in by_pod.items():
        fields[pod.encode()] = struct.pack(f"<{len(hashes)}Q", *hashes)
    return fields


def decode(fields: dict[bytes, bytes]) -> tuple[str, list[Announcement]]:
    """The entry's origin and announcements; ``ValueError`` for an entry that is not one."""
    origin = fields[ORIGIN].decode()
    at = float(fields[AT])
    out = []
    for key, value in fields.items():
        if key in (ORIGIN, AT):
            continue
        if len(value) % 8:
            raise ValueError(f"hashes of {key!r}: {len(value)} bytes")
        out.append(Announcement(key.decode(), struct.unpack(f"<{len(value) // 8}Q", value), at))
    return origin, out


class RedisPrefixSync(RedisRounds):
    def __init__(
        self,
        target: RedisTarget | str,
        keys: RedisKeys,
        producers: Callable[[], Iterable[RequestPlugin]],
        *,
        origin: str | None = None,
        interval: float = 0.05,
        batch: int = 4096,
        rounds: int = 16,
        max_entries: int = 2000,
        ttl: float = 600.0,
        io_timeout: float = 1.0,
        backoff: Backoff = RETRY,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``producers`` are the running profile's request plugins (the prefix producers among them
        are fed)."""
        super().__init__(
            target,
            name="prefix-sync",
            what="prefix index",
            unreachable="routing by this picker's own index",
            interval=interval,
            io_timeout=io_timeout,
            backoff=backoff,
            rng=rng,
            failures=(*FAILURES, ValueError),
        )
        self._key = keys.prefix_index
        self._plugins = producers
        self.origin = origin or default_origin()
        self._batch = batch
        self._rounds = rounds
        self._max_entries = max_entries
        self._ttl = ttl
        self._clock = clock
        self._last_id = b"0-0"  # the newest entry read
        self._fed: list[PrefixCacheProducer] = []  # the producers fed up to _last_id
        self._trimmed = 0.0
        self.published = 0  # entries appended
        self.learnt = 0  # announcements applied from other pickers

    def producers(self) -> list[PrefixCacheProducer]:
        return [p for p in self._plugins() if isinstance(p, PrefixCacheProducer)]

    async def sync(self) -> None:
        """One round: publish what the producers recorded, then read what the others published (a new
        producer gets the whole stream)."""
        assert self._client is not None, "start() first"
        producers = self.producers()
        async with asyncio.timeout(self._io_timeout):
            for producer in producers:
                await self._publish(producer)
            new = [p for p in producers if not any(p is fed for fed in self._fed)]
            old = [p for p in producers if p not in new]
            if old:
                await self._read(old, b"(" + self._last_id, b"+", advance=True)
                if new:  # the stream up to where the others are
                    await self._read(new, b"-", self._last_id, advance=False)
            elif new:
                await self._read(new, b"-", b"+", advance=True)
            self._fed = producers
            now = self._clock()
            if now - self._trimmed > self._ttl / 10:
                await self._client.xtrim(
                    self._key, minid=f"{int((now - self._ttl) * 1000)}-0", approximate=True
                )
                self._trimmed = now

    async def _publish(self, producer: PrefixCacheProducer) -> None:
        """Up to ``rounds`` entries of the producer's outbox in one round trip; put back if it fails."""
        assert self._client is not None
        batches = [producer.drain(self._batch) for _ in range(self._rounds) if producer.outbox()]
        if not batches:
            return
        try:
            pipe = self._client.pipeline(transaction=False)
            for batch in batches:
                pipe.xadd(self._key, encode(self.origin, batch), maxlen=self._max_entries, approximate=True)  # type: ignore[arg-type]
            await pipe.execute()
        except BaseException:
            producer.undrain([a for batch in batches for a in batch])
            raise
        self.published += len(batches)

    async def _read(
        self, producers: Sequence[PrefixCacheProducer], low: bytes, high: bytes, *, advance: bool
    ) -> None:
        """The entries from ``low`` to ``high`` (XRANGE bounds) to ``producers``, in pages; ``advance``
        moves the read position past them."""
        assert self._client is not None
        while True:
            # the client decodes no responses: ids and fields are bytes
            entries: list[tuple[bytes, dict[bytes, bytes]]] = await self._client.xrange(  # type: ignore[assignment]
                self._key, min=low, max=high, count=PAGE
            )
            for entry_id, fields in entries:
                try:
                    origin, announcements = decode(fields)
                except (KeyError, ValueError, UnicodeDecodeError):
                    log.warning("prefix index: entry %r is not an announcement; skipped", entry_id)
                    continue
                if origin != self.origin:
                    for producer in producers:
                        producer.learn(announcements)
                    self.learnt += len(announcements)
            if entries:
                low = b"(" + entries[-1][0]
                if advance:
                    self._last_id = entries[-1][0]
            if len(entries) < PAGE:
                return
