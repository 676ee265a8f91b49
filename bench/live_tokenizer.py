"""The live bench's tokenizer, built offline (nothing is downloaded): run by `.venv-perf`'s Python.

    .venv-perf/bin/python bench/live_tokenizer.py OUT_DIR WORD...

inference-perf needs a Hugging Face tokenizer to make prompts of exact lengths and to count the tokens
it receives. This one is a word-level tokenizer (``tokenizers``) saved with ``save_pretrained`` as
``tokenizer.json`` + ``tokenizer_config.json``, which ``AutoTokenizer.from_pretrained(OUT_DIR)`` loads:

- its vocabulary (what random prompts are drawn from) is the 1,000 words ``" 000"`` .. ``" 999"``: a
  space and three digits, so an n-token prompt is 4n characters, which the simulator (characters / 4)
  also counts as n tokens;
- the simulator's output words (``WORD...``, each with its leading space) are added tokens, outside
  the sampled vocabulary: every streamed word counts as one token, as the simulator generated it;
- it decodes by concatenation (``Fuse``) and adds no BOS.

It checks all three before it exits, and prints the vocabulary size.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

UNK = "[UNK]"


def build(out: Path, words: list[str]) -> None:
    vocab = {UNK: 0} | {f" {i:03d}": i + 1 for i in range(1000)}
    core = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    # Each piece is its leading whitespace and a word, as the vocabulary spells them.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s*\S+"), behavior="isolated")
    core.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token=UNK, clean_up_tokenization_spaces=False, model_max_length=1 << 20
    )
    fast.add_tokens([AddedToken(" " + word, normalized=False) for word in words])
    fast.save_pretrained(str(out))


def check(out: Path, words: list[str]) -> int:
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    ids = list(range(1, 41))
    prompt = tokenizer.decode(ids, skip_special_tokens=True)
    assert len(prompt) == 4 * len(ids), f"a 40-token prompt is {len(prompt)} characters, not 160"
    assert tokenizer(prompt).input_ids == ids, "a prompt does not tokenize back to its own ids"
    output = "".join(" " + word for word in words * 3)
    counted = len(tokenizer(output, add_special_tokens=False).input_ids)
    assert counted == 3 * len(words), f"{counted} tokens counted in {3 * len(words)} output words"
    assert tokenizer.unk_token_id not in tokenizer(output).input_ids, "an output word is unknown"
    return int(tokenizer.vocab_size)


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    words = sorted(set(sys.argv[2:]))
    out.mkdir(parents=True, exist_ok=True)
    build(out, words)
    print(f"tokenizer in {out}: vocabulary {check(out, words)} words, {len(words)} output words")
    return 0


if __name__ == "__main__":
    sys.exit(main())
