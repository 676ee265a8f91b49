from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pointsman_sim.prefix import (
    Span,
    block_hashes,
    prompt_text,
    span_text,
    span_tokens,
    spans_block_hashes,
    tokenize,
)


@pytest.mark.parametrize(
    ("text", "count"),
    [("", 1), ("abc", 1), ("abcd", 1), ("abcdefg", 1), ("abcdefgh", 2), ("x" * 4096, 1024), ("ünïcødé!", 2)],
    ids=["empty", "short", "one", "one-with-rest", "two", "4k", "non-ascii"],
)
def test_tokenize_counts_four_characters_a_token(text: str, count: int) -> None:
    assert len(tokenize(text)) == count


def test_tokenize_is_deterministic_and_prefix_preserving() -> None:
    system = "You are a helpful assistant. " * 20
    a, b = tokenize(system + "What is the capital of France?"), tokenize(system + "Why is the sky blue?")
    assert tokenize(system + "What is the capital of France?") == a
    # Whole 4-character tokens of the shared text are the same ids.
    shared = len(system) // 4
    assert a[:shared] == b[:shared]
    assert a != b


@pytest.mark.parametrize(
    ("tokens", "blocks"),
    [(0, 0), (15, 0), (16, 1), (31, 1), (32, 2), (100, 6)],
)
def test_only_full_blocks_have_hashes(tokens: int, blocks: int) -> None:
    assert len(block_hashes(list(range(tokens)), None, 16)) == blocks


def test_a_block_hash_depends_on_its_prefix_and_the_adapter() -> None:
    ids = list(range(64))
    base = block_hashes(ids, None, 16)
    assert block_hashes(ids[:32], None, 16) == base[:2]
    assert block_hashes(ids, "sql-lora", 16) != base  # a LoRA request never hits a base-model block
    assert set(block_hashes(ids, "sql-lora", 16)).isdisjoint(block_hashes(ids, "other-lora", 16))
    # The same block after another prefix is another block.
    other = block_hashes([99] * 16 + ids[16:], None, 16)
    assert other[0] != base[0]
    assert set(other[1:]).isdisjoint(base)


def test_a_span_is_the_same_ids_wherever_it_appears() -> None:
    assert span_tokens(Span(7, 40)) == span_tokens(Span(7, 40))
    assert span_tokens(Span(7, 40)) != span_tokens(Span(8, 40))
    assert len(span_tokens(Span(7, 40))) == 40
    with pytest.raises(ValueError, match="negative"):
        Span(1, -1)


SPANS = st.lists(st.builds(Span, st.integers(0, 5), st.integers(0, 50)), max_size=5).map(tuple)


@given(SPANS, st.sampled_from([None, "a"]))
def test_spans_hash_as_their_ids_would(spans: tuple[Span, ...], adapter: str | None) -> None:
    ids = [t for span in spans for t in span_tokens(span)]
    assert spans_block_hashes(spans, adapter, 16) == block_hashes(ids, adapter, 16)


def test_span_text_is_four_letters_a_token_and_shares_prefixes_as_the_spans_do() -> None:
    system, a, b = Span(1, 100), Span(2, 20), Span(3, 20)
    one, two = prompt_text((system, a), 120), prompt_text((system, b), 120)
    assert len(one) == 480
    assert len(tokenize(one)) == 120  # the simulator counts the text as the spans' tokens
    assert one[:400] == two[:400]
    assert one[400:] != two[400:]
    assert prompt_text((system, a), 100) == span_text(system)  # only the prompt: the rest is output
