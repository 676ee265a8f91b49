"""Which pods probably hold which prompt blocks in their prefix cache: upstream's approximate prefix
index, one bounded LRU per pod and a map from block hash to the pods that have it.

A block hash (:func:`block_hashes`) is an xxhash64 chain over the prompt's bytes in blocks of
``block_chars`` characters, seeded by the target model and the request's ``cache_salt``, so block
``i``'s hash names blocks ``0..i`` too: two prompts share block ``i``'s hash only when they share
their first ``i + 1`` blocks (a LoRA adapter never shares a base model's blocks, as in vLLM). Upstream
appends the previous hash to the block; passing it as xxhash's seed chains the same way for a third
less CPU (the hashes never leave Pointsman). Only full blocks are hashed, as vLLM caches only full
blocks.

The LRU of a pod keeps, per block it holds, the time the block was last announced to the other
pickers (see :mod:`~pointsman_picker.scheduling.prefix_cache`). Pure: time comes in as arguments.

Memory: one entry is one (block, pod) pair: an ``OrderedDict`` item (hash and time) in the pod's LRU
and the block's owner (one address, or a tuple of them when several pods hold it): 174 bytes an entry in
CPython 3.11 (``bench/decision_cost.py --prefix`` measures it). The index holds at most ``pods x
capacity`` entries: 1,000 pods at upstream's 31,250 blocks each is 31 M entries, 5.4 GB, once as many
distinct blocks were sent to every pod; a pool that large wants ``lruCapacityPerServer`` lowered (2,000
blocks a pod, 128 K tokens of prompts: 350 MB per 1,000 pods).
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Iterator, Sequence
from struct import iter_unpack

import xxhash

_xxh64 = xxhash.xxh64_intdigest


def block_hashes(model: str, salt: str, data: bytes, block_chars: int, max_blocks: int) -> tuple[int, ...]:
    """The hash of each full ``block_chars`` block of ``data``'s first ``max_blocks`` blocks; hash
    ``i`` is xxhash64 of block ``i`` seeded with hash ``i - 1``, hash ``-1`` being xxhash64 of
    ``model`` and ``salt``."""
    if block_chars <= 0 or max_blocks <= 0 or len(data) < block_chars:
        return ()
    end = min(len(data) // block_chars, max_blocks) * block_chars
    return _chain(_xxh64((model + salt).encode()), data, 0, end, block_chars)


class BlockHasher:
    """:func:`block_hashes` that remembers the prompts it hashed lately, one per first block (and model,
    salt and block size): a prompt that begins as one of them (a shared system prompt, the turn before
    in a conversation) takes that one's hashes for the full blocks they share, found by comparing bytes,
    and hashes only the rest. The hashes are the same, since hash ``i`` depends on blocks ``0..i``
    alone; the int objects too, so the index's lookups of them compare by identity. Memory: at most
    ``limit`` prompts of ``max_blocks`` blocks and their hashes (256 x 16 KB + 10 KB, 7 MB, at
    upstream's 256 blocks of 64 characters)."""

    def __init__(self, limit: int = 256) -> None:
        self._limit = limit
        # (model + salt, block size, first block) -> the newest such prompt's hashed bytes and hashes,
        # least recently used first
        self._recent: dict[tuple[str, int, bytes], tuple[bytes, tuple[int, ...]]] = {}

    def __call__(
        self, model: str, salt: str, data: bytes, block_chars: int, max_blocks: int
    ) -> tuple[int, ...]:
        if block_chars <= 0 or max_blocks <= 0 or len(data) < block_chars:
            return ()
        blocks = min(len(data) // block_chars, max_blocks)
        end = blocks * block_chars
        seed = model + salt
        key = (seed, block_chars, data[:block_chars])
        recent = self._recent.pop(key, None)
        if recent is None:
            hashes = block_hashes(model, salt, data, block_chars, max_blocks)
        else:
            held, known = recent
            # The first block is the key's; bisect for the most full blocks the two share (startswith of
            # a memoryview compares in place).
            view = memoryview(data)
            low, high = 1, min(blocks, len(known))
            if held.startswith(view[: high * block_chars]):
                low = high
            while low < high:
                mid = (low + high + 1) // 2
                if held.startswith(view[: mid * block_chars]):
                    low = mid
                else:
                    high = mid - 1
            hashes = (
                known[:low]
                if low == blocks
                else known[:low] + _chain(known[low - 1], data, low * block_chars, end, block_chars)
            )
        self._recent[key] = (data if len(data) == end else data[:end], hashes)
        if len(self._recent) > self._limit:
            del self._recent[next(iter(self._recent))]
        return hashes


def _chain(previous: int, data: bytes, start: int, end: int, block_chars: int) -> tuple[int, ...]:
    out: list[int] = []
    append = out.append
    # iter_unpack cuts the blocks in C: a fifth less CPU than slicing them here
    for (block,) in iter_unpack(f"{block_chars}s", memoryview(data)[start:end]):
        previous = _xxh64(block, previous)
        append(previous)
    return tuple(out)


class PrefixIndex:
    def __init__(self) -> None:
        self._lrus: dict[str, OrderedDict[int, float]] = {}
        self._capacity: dict[str, int] = {}
        # The pods holding each block: one pod's address as it is (most blocks are on one pod), a tuple
        # of them once two hold it (hashable, so match counts owners in C; 56 bytes for two, a set 216).
        self._owners: dict[int, str | tuple[str, ...]] = {}

    def __len__(self) -> int:
        """The (block, pod) entries held."""
        return sum(len(lru) for lru in self._lrus.values())

    def pods(self) -> list[str]:
        return list(self._lrus)

    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        """Per pod, how many of ``hashes`` it holds, counted from the first block up to the first block
        no pod holds (longest prefix first, as upstream)."""
        # The lookups and the counting run in C (map, list.index, Counter): a 4 KB prompt's 64 blocks
        # cost a few dict operations of Python, not a loop of them.
        found = list(map(self._owners.get, hashes))
        if None in found:
            del found[found.index(None) :]
        if not found:
            return {}
        first = found[0]
        if type(first) is str and found.count(first) == len(found):
            return {first: len(found)}
        counts: dict[str, int] = {}
        for owner, n in Counter(found).items():
            if type(owner) is str:
                counts[owner] = counts.get(owner, 0) + n
            else:
                for one in owner:  # type: ignore[union-attr]  # a tuple: the str case is above
                    counts[one] = counts.get(one, 0) + n
        return counts

    def add(self, pod: str, hashes: Sequence[int], capacity: int, now: float, fresh: float) -> list[int]:
        """Record that ``pod`` holds ``hashes`` (its LRU holding at most ``capacity``, the least recently
        added going first); return those it did not hold, or last announced before ``now - fresh``,
        stamped ``now``: what to announce."""
        lru = self._lrus.get(pod)
        if lru is None:
            lru = self._lrus[pod] = OrderedDict()
        self._capacity[pod] = capacity
        stale = now - fresh
        times = list(map(lru.get, hashes))
        try:
            held = min(times, default=stale) > stale  # type: ignore[type-var,operator]  # a None raises
        except TypeError:  # a block the pod does not hold
            held = False
        if held:
            # The pod holds every block, announced lately (a prompt sent again): only their recency
            # changes, in C.
            deque(map(lru.move_to_end, hashes), maxlen=0)
            self._trim(pod, lru, capacity)
            return []
        owners = self._owners
        announce = []
        for h, at in zip(hashes, times, strict=True):
            if at is None:
                _own(owners, h, pod)
            else:
                lru.move_to_end(h)
                if at > stale:
                    continue
            lru[h] = now
            announce.append(h)
        self._trim(pod, lru, capacity)
        return announce

    def learn(self, pod: str, hashes: Sequence[int], at: float, capacity: int) -> None:
        """Record what another picker announced: ``pod`` holds ``hashes`` as of ``at`` (most recent
        last); a block this index already holds is only moved up its pod's LRU."""
        lru = self._lrus.get(pod)
        if lru is None:
            lru = self._lrus[pod] = OrderedDict()
            self._capacity[pod] = capacity
        owners = self._owners
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
                if lru[h] < at:
                    lru[h] = at
                continue
            lru[h] = at
            _own(owners, h, pod)
        self._trim(pod, lru, self._capacity[pod])

    def _trim(self, pod: str, lru: OrderedDict[int, float], capacity: int) -> None:
        owners = self._owners
        while len(lru) > capacity:
            old, _ = lru.popitem(last=False)
            _disown(owners, old, pod)

    def remove(self, pod: str) -> None:
        """Forget ``pod`` (it left the pool)."""
        lru = self._lrus.pop(pod, None)
        self._capacity.pop(pod, None)
        if lru is None:
            return
        owners = self._owners
        for h in lru:
            _disown(owners, h, pod)

    def entries(self, pod: str) -> Iterator[tuple[int, float]]:
        """``pod``'s blocks and their times, least recent first."""
        return iter(list(self._lrus.get(pod, {}).items()))


def _own(owners: dict[int, str | tuple[str, ...]], h: int, pod: str) -> None:
    pods = owners.get(h)
    if pods is None:
        owners[h] = pod
    elif type(pods) is str:
        if pods != pod:
            owners[h] = (pods, pod)
    elif pod not in pods:
        owners[h] = (*pods, pod)


def _disown(owners: dict[int, str | tuple[str, ...]], h: int, pod: str) -> None:
    pods = owners[h]
    if type(pods) is str:
        del owners[h]  # a pod's LRU holds only blocks the pod owns
        return
    rest = tuple(p for p in pods if p != pod)
    owners[h] = rest[0] if len(rest) == 1 else rest
