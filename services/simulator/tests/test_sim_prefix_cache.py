from __future__ import annotations

from pointsman_sim.prefix_cache import PrefixCache


def test_a_block_is_cached_once_and_shared() -> None:
    cache = PrefixCache()
    assert cache.add(1)
    assert cache.add(2)
    assert not cache.add(1)  # another copy of the same block stays the request's own
    assert cache.match([1, 2, 3], 3) == 2
    assert cache.match([1, 2, 3], 1) == 1
    assert cache.match([3, 1], 2) == 0  # a prefix: counting stops at the first block not cached
    assert cache.acquire([1, 2]) == 0  # both in use: nothing taken from the free blocks
    assert cache.release([1, 2]) == 0  # the first holder still has them
    assert cache.release([1, 2]) == 2
    assert (cache.in_use_count, cache.free_count) == (0, 2)


def test_free_blocks_are_evicted_least_recently_freed_first_last_block_first() -> None:
    cache = PrefixCache()
    for block in (1, 2, 3):
        cache.add(block)
    cache.release([1, 2, 3])  # freed 3, 2, 1: the tail of the prefix goes first
    cache.add(9)
    cache.release([9])
    cache.evict(2)
    assert [b in cache for b in (1, 2, 3, 9)] == [True, False, False, True]


def test_acquiring_a_free_block_takes_it_out_of_the_free_ones() -> None:
    cache = PrefixCache()
    cache.add(1)
    cache.release([1])
    assert cache.free_among([1]) == 1
    assert cache.acquire([1]) == 1
    assert (cache.in_use_count, cache.free_count) == (1, 0)
    cache.evict(0)
    assert 1 in cache
