"""Prompts as token ids and KV blocks as a hash chain, as vLLM V1's automatic prefix caching sees them.

Pure: no I/O, no clock, no randomness from the world.

- **The stand-in tokenizer** (:func:`tokenize`): no model is downloaded, so text becomes token ids by a
  fixed rule: every 4 characters are one token (the last token takes the 1-7 characters left at the
  end; a text shorter than 4 characters is one token), its id the CRC-32 of the characters' UTF-8. The
  count is what the simulator has always charged (about four characters per token, as English text
  with a Llama tokenizer; at least one) and the same text always gives the same ids, so two prompts
  that share their first 64·k characters share their first k blocks.
- **Token spans** (:class:`Span`): a virtual-time trace describes a prompt without spelling its ids: a
  span is ``length`` ids drawn from its ``seed``, so a system prompt shared by a group of requests is
  the same span at the head of each one's tokens, and a conversation's next turn repeats its earlier
  turns' spans.
  :func:`span_text` spells a span as text of 4 letters a token, for a client (or a picker) that
  needs the prompt itself.
- **Block hashes** (:func:`block_hashes`): one hash per full block of ``block_size`` tokens, each over
  the previous block's hash, the block's ids and the adapter (vLLM's ``hash_block_tokens`` with the
  LoRA name among the extra keys), so a block matches only after the same prefix for the same adapter:
  a LoRA request never hits a base-model block nor another adapter's. A partial last block has none.

The hashes are Python's hash of tuples of ints and strings: unique enough for a simulation (64 bits)
and stable within a process, which is all the engine compares.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

CHARS_PER_TOKEN = 4
_VOCABULARY = 128_256  # Llama 3's, so span ids look like real ones


def tokenize(text: str) -> tuple[int, ...]:
    """The stand-in tokenizer's ids for ``text`` (module docstring): ``max(1, len(text) // 4)`` of them."""
    count = max(1, len(text) // CHARS_PER_TOKEN)
    ends = [CHARS_PER_TOKEN * (i + 1) for i in range(count - 1)] + [len(text)]
    starts = [0, *ends[:-1]]
    return tuple(zlib.crc32(text[a:b].encode()) for a, b in zip(starts, ends, strict=True))


@dataclass(frozen=True, slots=True)
class Span:
    """``length`` token ids drawn from ``seed``: the same span is the same ids wherever it appears."""

    seed: int
    length: int

    def __post_init__(self) -> None:
        if self.length < 0:
            raise ValueError(f"a span's length must not be negative, got {self.length}")


@lru_cache(maxsize=4096)
def span_tokens(span: Span) -> tuple[int, ...]:
    """The ids of ``span`` (kept for the spans used most: a shared system prompt is drawn once)."""
    draw = random.Random(span.seed).randrange
    return tuple(draw(_VOCABULARY) for _ in range(span.length))


@lru_cache(maxsize=4096)
def span_text(span: Span) -> str:
    """Text standing for ``span``: 4 letters a token (each id in base 26), so a client that sends it
    sends a prompt the stand-in tokenizer counts as ``span.length`` tokens, and texts share prefixes
    exactly where the spans do."""
    return "".join(_word(token) for token in span_tokens(span))


def prompt_text(spans: tuple[Span, ...], prompt_tokens: int) -> str:
    """The text of the first ``prompt_tokens`` tokens of ``spans`` (the prompt; the rest is output)."""
    text = "".join(span_text(span) for span in spans)
    return text[: CHARS_PER_TOKEN * prompt_tokens]


def _word(token: int) -> str:
    letters = []
    for _ in range(CHARS_PER_TOKEN):
        token, digit = divmod(token, 26)
        letters.append(chr(97 + digit))
    return "".join(letters)


def block_hashes(tokens: Sequence[int], adapter: str | None, block_size: int) -> tuple[int, ...]:
    """The chain of hashes of the full blocks of ``tokens`` for ``adapter`` (None: the base model)."""
    hashes: list[int] = []
    parent = hash(("root", adapter))
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[start : start + block_size])))
        hashes.append(parent)
    return tuple(hashes)


def spans_block_hashes(spans: tuple[Span, ...], adapter: str | None, block_size: int) -> tuple[int, ...]:
    """:func:`block_hashes` of the spans' ids one after the other, worked out once per prefix of spans:
    a trace whose requests share their first spans hashes those blocks once."""
    return _chain(spans, adapter, block_size)[0]


@lru_cache(maxsize=8192)
def _chain(
    spans: tuple[Span, ...], adapter: str | None, block_size: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The block hashes of the spans' ids and the ids after the last full block."""
    if not spans:
        return (), ()
    hashes, rest = _chain(spans[:-1], adapter, block_size)
    tokens = rest + span_tokens(spans[-1])
    parent = hashes[-1] if hashes else hash(("root", adapter))
    new: list[int] = []
    full = len(tokens) - len(tokens) % block_size
    for start in range(0, full, block_size):
        parent = hash((parent, tokens[start : start + block_size]))
        new.append(parent)
    return hashes + tuple(new), tokens[full:]
