"""The prefix index: upstream's hash chain, longest-prefix matching, per-pod LRU bounds, what is
announced, what another picker's announcements do, and pods leaving."""

from __future__ import annotations

import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from pointsman_picker.scheduling.prefix_index import BlockHasher, PrefixIndex, block_hashes


def chain(model: str, blocks: list[bytes]) -> tuple[int, ...]:
    """The chain written out: hash(block i, seed = hash(i - 1)), hash(-1) = hash(model)."""
    out, previous = [], xxhash.xxh64_intdigest(model.encode())
    for block in blocks:
        previous = xxhash.xxh64_intdigest(block, previous)
        out.append(previous)
    return tuple(out)


@pytest.mark.parametrize(
    ("data", "block", "most", "blocks"),
    [
        (b"a" * 64, 64, 256, [b"a" * 64]),
        (b"a" * 63, 64, 256, []),  # shorter than a block: nothing to match
        (b"a" * 64 + b"b" * 64 + b"c" * 10, 64, 256, [b"a" * 64, b"b" * 64]),  # only full blocks
        (b"a" * 64 + b"b" * 64, 64, 1, [b"a" * 64]),  # at most max_blocks
        (b"abcdefgh", 4, 256, [b"abcd", b"efgh"]),
        (b"abcd", 0, 256, []),
    ],
)
def test_block_hashes_are_a_chain_over_full_blocks(data, block, most, blocks):
    assert block_hashes("m", "", data, block, most) == chain("m", blocks)


def test_the_model_and_the_salt_seed_the_chain():
    data = b"x" * 128
    base = block_hashes("base", "", data, 64, 256)
    assert block_hashes("adapter", "", data, 64, 256) != base
    assert block_hashes("base", "s", data, 64, 256) != base
    assert block_hashes("base", "s", data, 64, 256) == chain("bases", [b"x" * 64] * 2)  # model then salt
    assert block_hashes("base", "", data, 64, 256) == base  # deterministic


SYSTEM = b"You are a careful assistant. " * 8  # 224 bytes: 3 blocks of 64 and a part


@pytest.mark.parametrize(
    "prompts",
    [
        [SYSTEM + b"first question " * 9, SYSTEM + b"other question " * 9],  # a shared system prompt
        [SYSTEM * 2, SYSTEM * 2],  # the same prompt again
        [SYSTEM * 3, SYSTEM, SYSTEM * 3],  # shorter, then longer than the one remembered
        [SYSTEM[:64] + b"x" * 128, SYSTEM * 2],  # only the first block shared
        [SYSTEM * 2, SYSTEM[:63], SYSTEM[:64]],  # shorter than a block, then one block
        [b"\xe2\x82\xac" * 100, b"\xe2\x82\xac" * 99 + b"x"],  # multi-byte UTF-8
    ],
)
def test_the_hasher_reuses_a_shared_beginning_with_the_same_hashes(prompts):
    hasher = BlockHasher()
    for data in prompts:
        assert hasher("m", "", data, 64, 256) == block_hashes("m", "", data, 64, 256)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (("m", "", 64, 256), ("adapter", "", 64, 256)),  # another model
        (("m", "", 64, 256), ("m", "salt", 64, 256)),  # another salt
        (("m", "", 64, 256), ("m", "", 32, 256)),  # another block size
        (("m", "", 64, 256), ("m", "", 64, 2)),  # fewer blocks
        (("m", "", 64, 2), ("m", "", 64, 256)),  # more blocks than remembered
    ],
)
def test_the_hasher_reuses_only_what_the_same_parameters_hashed(first, second):
    hasher = BlockHasher()
    data = SYSTEM * 3
    model, salt, chars, blocks = first
    hasher(model, salt, data, chars, blocks)
    model, salt, chars, blocks = second
    assert hasher(model, salt, data, chars, blocks) == block_hashes(model, salt, data, chars, blocks)


BLOCKS = [b"aaaa", b"abab", b"bbbb", b"aaab"]


@given(
    st.integers(1, 3),
    st.lists(
        st.tuples(
            st.lists(st.sampled_from(BLOCKS), max_size=8).map(b"".join),
            st.binary(max_size=5),  # a tail of a part block, or more
            st.sampled_from(["m", "n"]),
            st.sampled_from(["", "s"]),
            st.sampled_from([2, 4, 8]),
            st.sampled_from([1, 3, 256]),
        ),
        max_size=12,
    ),
)
def test_the_hasher_is_block_hashes(limit, calls):
    """Prompts from a few blocks share beginnings of every length; a small memory forgets some."""
    hasher = BlockHasher(limit)
    for body, tail, model, salt, chars, blocks in calls:
        data = body + tail
        assert hasher(model, salt, data, chars, blocks) == block_hashes(model, salt, data, chars, blocks)


@pytest.mark.parametrize(
    ("held", "query", "matched"),
    [
        ({"a": [1, 2, 3]}, [1, 2, 3, 4], {"a": 3}),
        ({"a": [1, 2], "b": [1]}, [1, 2, 3], {"a": 2, "b": 1}),
        ({"a": [2, 3]}, [1, 2, 3], {}),  # the first block held by nobody ends the match
        ({"a": [1, 3]}, [1, 2, 3], {"a": 1}),
        ({}, [1], {}),
        ({"a": [1, 2], "b": [1, 2], "c": [1]}, [1, 2], {"a": 2, "b": 2, "c": 1}),  # owners of 2 and 3
        ({"a": [1], "b": [1, 2]}, [1, 2, 3], {"a": 1, "b": 2}),
    ],
)
def test_match_counts_the_longest_prefix(held, query, matched):
    index = PrefixIndex()
    for pod, hashes in held.items():
        index.add(pod, hashes, 100, 0.0, 60.0)
    assert index.match(query) == matched


def test_each_pod_keeps_its_capacity_least_recent_first_out():
    index = PrefixIndex()
    index.add("a", [1, 2, 3], 3, 0.0, 60.0)
    index.add("a", [1], 3, 1.0, 60.0)  # 1 used again: 2 is now the least recent
    index.add("a", [4], 3, 2.0, 60.0)
    assert [h for h, _ in index.entries("a")] == [3, 1, 4]
    assert index.match([2]) == {}
    assert index.match([1]) == {"a": 1}
    assert len(index) == 3


def test_a_block_several_pods_hold_is_matched_until_each_lets_it_go():
    index = PrefixIndex()
    for pod in ("a", "b", "c"):
        index.add(pod, [1], 1, 0.0, 60.0)
    index.add("b", [2], 1, 1.0, 60.0)  # b's LRU of one lets block 1 go
    assert index.match([1]) == {"a": 1, "c": 1}
    index.add("a", [3], 1, 2.0, 60.0)
    assert index.match([1]) == {"c": 1}
    index.add("a", [1], 1, 3.0, 60.0)
    index.add("b", [1], 1, 3.0, 60.0)
    assert index.match([1]) == {"c": 1, "a": 1, "b": 1}


def test_a_prompt_held_again_only_moves_up_its_pod_lru():
    index = PrefixIndex()
    index.add("a", [1, 2], 3, 0.0, 60.0)
    index.add("a", [3], 3, 1.0, 60.0)
    assert index.add("a", [1, 2], 3, 2.0, 60.0) == []  # held and announced lately: nothing to say
    index.add("a", [4], 3, 3.0, 60.0)  # 3 is now the least recent
    assert [h for h, _ in index.entries("a")] == [1, 2, 4]
    assert dict(index.entries("a"))[1] == 0.0  # its announcement time stays


def test_add_returns_what_to_announce():
    index = PrefixIndex()
    assert index.add("a", [1, 2], 10, 0.0, 60.0) == [1, 2]
    assert index.add("a", [1, 2, 3], 10, 30.0, 60.0) == [3]  # only the new block
    assert index.add("a", [1, 2, 3], 10, 61.0, 60.0) == [1, 2]  # announced over a minute ago: again
    assert index.add("b", [1], 10, 61.0, 60.0) == [1]  # another pod holds it anew


def test_learn_adds_without_announcing_and_keeps_the_newest_time():
    index = PrefixIndex()
    index.learn("a", [1, 2], 5.0, 10)
    assert index.match([1, 2]) == {"a": 2}
    index.learn("a", [1], 3.0, 10)  # older news does not make it older
    assert dict(index.entries("a")) == {2: 5.0, 1: 5.0}
    assert index.add("a", [1, 2], 10, 6.0, 60.0) == []  # announced by another picker: nothing new
    index.learn("a", [3, 4, 5, 6, 7, 8, 9, 10, 11], 7.0, 10)
    assert len(index) == 10  # the capacity holds for learnt blocks too


def test_remove_forgets_a_pod_and_its_blocks():
    index = PrefixIndex()
    index.add("a", [1, 2], 10, 0.0, 60.0)
    index.add("b", [1], 10, 0.0, 60.0)
    index.remove("a")
    index.remove("gone")
    assert index.match([1, 2]) == {"b": 1}
    assert index.pods() == ["b"]
    assert len(index) == 1
