"""What plugins read of a request's prompt: its length in tokens, estimated from the body's text, and its
bytes in the order a prefix cache sees them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

CHARS_PER_TOKEN = 4  # the usual estimate for English text and the Llama tokenizers


def estimate_prompt_tokens(doc: Mapping[str, Any]) -> int:
    """The prompt's length in tokens, estimated at four characters a token from a completions
    ``prompt`` (a string or strings) or the chat ``messages``' text; 0 when the body has neither."""
    chars = 0
    prompt = doc.get("prompt")
    if isinstance(prompt, str):
        chars = len(prompt)
    elif isinstance(prompt, list):
        chars = sum(len(p) for p in prompt if isinstance(p, str))
    messages = doc.get("messages")
    if isinstance(messages, list):
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                chars += len(content)
            elif isinstance(content, list):
                for part in content:
                    text = part.get("text") if isinstance(part, dict) else None
                    if isinstance(text, str):
                        chars += len(text)
    return chars // CHARS_PER_TOKEN


def prompt_bytes(doc: Mapping[str, Any]) -> bytes:
    """The bytes a prefix cache would see first, as upstream's prefix plugin reads them: a completions
    ``prompt`` (strings joined), else the chat ``messages`` serialized as compact JSON (the server's
    chat template puts them first in the same order); ``b""`` when the body has neither."""
    prompt = doc.get("prompt")
    if isinstance(prompt, str):
        return prompt.encode()
    if isinstance(prompt, list):
        return "".join(p for p in prompt if isinstance(p, str)).encode()
    messages = doc.get("messages")
    if isinstance(messages, list) and messages:
        return json.dumps(messages, separators=(",", ":"), ensure_ascii=False).encode()
    return b""
