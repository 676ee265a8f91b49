"""The live requests' prompts: n tokens for the bench's tokenizer and for the simulator alike."""

from __future__ import annotations

# The simulator counts a prompt's tokens as its characters / 4. The bench's tokenizer
# (bench/live_tokenizer.py) has words of a space and three digits, so an n-token prompt made from its
# vocabulary is 4n characters: n tokens for the pods too.
PROMPT_WORD_CHARS = 4


def prompt_text(tokens: int, offset: int = 0) -> str:
    """A prompt of ``tokens`` words of the bench tokenizer's vocabulary (``" 000"`` .. ``" 999"``)."""
    return "".join(f" {(offset + i) % 1000:03d}" for i in range(tokens))
