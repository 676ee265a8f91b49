"""The engine's cached KV blocks, by hash: vLLM V1's automatic prefix caching without block ids.

A full block a request computed is cached under its hash (``prefix.block_hashes``); a later request
whose first blocks have cached hashes takes those blocks instead of computing them. A cached block is
either **in use** (held by the requests that have it, counted) or **free** (no request holds it: its
keys and values stay until the engine needs the block for something else; least recently freed is
evicted first). The engine counts physical blocks; this keeps which of them are cached and so shared.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    def __init__(self) -> None:
        self._in_use: dict[int, int] = {}  # hash -> requests holding it
        self._free: OrderedDict[int, None] = OrderedDict()  # least recently freed first

    @property
    def free_count(self) -> int:
        """Cached blocks no request holds (the engine counts them among its free blocks)."""
        return len(self._free)

    @property
    def in_use_count(self) -> int:
        return len(self._in_use)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._in_use or block_hash in self._free

    def match(self, hashes: Sequence[int], limit: int) -> int:
        """How many of the first ``limit`` blocks of ``hashes`` are cached, counted until one is not."""
        matched = 0
        in_use, free = self._in_use, self._free
        for block_hash in hashes[:limit]:
            if block_hash not in in_use and block_hash not in free:
                break
            matched += 1
        return matched

    def free_among(self, hashes: Sequence[int]) -> int:
        """How many of ``hashes`` (all cached) are free blocks: what :meth:`acquire` takes from the free
        blocks."""
        free = self._free
        return sum(1 for block_hash in hashes if block_hash in free)

    def acquire(self, hashes: Sequence[int]) -> int:
        """A request takes the cached blocks ``hashes``; return how many of them were free."""
        taken = 0
        in_use, free = self._in_use, self._free
        for block_hash in hashes:
            if block_hash in free:
                del free[block_hash]
                in_use[block_hash] = 1
                taken += 1
            else:
                in_use[block_hash] += 1
        return taken

    def add(self, block_hash: int) -> bool:
        """A request just filled a block: cache it as held by that request. ``False`` when another block
        already has this hash (the request keeps its copy uncached, as a block of its own)."""
        if block_hash in self._in_use or block_hash in self._free:
            return False
        self._in_use[block_hash] = 1
        return True

    def release(self, hashes: Sequence[int]) -> int:
        """A request lets go of the cached blocks ``hashes`` (in block order); return how many became
        free. The last block is freed first, so it is evicted before the prefix it extends, as vLLM
        frees a request's blocks in reverse order."""
        freed = 0
        in_use, free = self._in_use, self._free
        for block_hash in reversed(hashes):
            left = in_use[block_hash] - 1
            if left:
                in_use[block_hash] = left
            else:
                del in_use[block_hash]
                free[block_hash] = None
                freed += 1
        return freed

    def evict(self, count: int) -> None:
        """Forget the ``count`` least recently freed blocks (the engine reuses them)."""
        free = self._free
        for _ in range(count):
            free.popitem(last=False)
